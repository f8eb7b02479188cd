package dev.gradbridge.online;

import dev.gradbridge.GradbridgeException;

/**
 * {@link OnlineLearner#learn} refused feedback because the queue of events waiting for training
 * is full (back-pressure): nothing of the call was logged or queued; retry later. An HTTP service
 * answers 429.
 */
public class QueueFullException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message how full the queue is
     */
    public QueueFullException(String message) {
        super(message);
    }
}
