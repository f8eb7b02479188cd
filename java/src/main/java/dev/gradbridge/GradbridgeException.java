package dev.gradbridge;

/**
 * Base of every gradbridge error. Unchecked so that callers from Python (JPype) and Java alike
 * receive one clear message; subclasses say which kind of input was at fault.
 */
public class GradbridgeException extends RuntimeException {

    private static final long serialVersionUID = 1L;

    /**
     * Creates an exception with a message that names the file, method or tensor at fault.
     *
     * @param message what went wrong and, where possible, how to fix it
     */
    public GradbridgeException(String message) {
        super(message);
    }

    /**
     * Creates an exception that keeps its cause.
     *
     * @param message what went wrong and, where possible, how to fix it
     * @param cause the underlying error
     */
    public GradbridgeException(String message, Throwable cause) {
        super(message, cause);
    }
}
