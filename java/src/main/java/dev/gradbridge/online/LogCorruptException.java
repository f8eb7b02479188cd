package dev.gradbridge.online;

import dev.gradbridge.GradbridgeException;

/**
 * A feedback log or online checkpoint cannot be used: a damaged frame before the end, a wrong
 * header, a record that contradicts the ones before it, or a checkpoint that does not match the
 * log. The message names the file and the offset. A torn tail (an incomplete last frame) is not
 * this: it is cut on open. Nothing is changed when this is thrown.
 */
public class LogCorruptException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message the file and what is wrong with it
     */
    public LogCorruptException(String message) {
        super(message);
    }
}
