package dev.gradbridge;

/**
 * An argument does not match what the module expects: shape, dtype, type or value. The module
 * is left as it was before the call.
 */
public class InvalidInputException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message expected versus actual, naming the tensor or option
     */
    public InvalidInputException(String message) {
        super(message);
    }
}
