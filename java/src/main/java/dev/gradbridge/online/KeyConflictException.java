package dev.gradbridge.online;

import dev.gradbridge.GradbridgeException;

/** Feedback came with an idempotency key that an earlier, different request used; nothing was logged. */
public class KeyConflictException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message the key and what differs
     */
    public KeyConflictException(String message) {
        super(message);
    }
}
