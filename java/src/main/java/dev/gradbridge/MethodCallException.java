package dev.gradbridge;

/** A scripted method raised an error inside libtorch; the message names file and method. */
public class MethodCallException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    MethodCallException(String message, Throwable cause) {
        super(message, cause);
    }
}
