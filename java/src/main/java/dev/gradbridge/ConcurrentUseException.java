package dev.gradbridge;

/**
 * Two threads called one TrainingModule at the same time. The second call is refused before it
 * touches the module, so the module's state stays whole; load one module per thread.
 */
public class ConcurrentUseException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    ConcurrentUseException(String message) {
        super(message);
    }
}
