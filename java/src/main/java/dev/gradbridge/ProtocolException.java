package dev.gradbridge;

/**
 * A TorchScript file lacks part of the training-module protocol (metadata or methods), or a
 * method that the module does not have was called.
 */
public class ProtocolException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    /** @param message one line naming the file and what it lacks */
    public ProtocolException(String message) {
        super(message);
    }
}
