package dev.gradbridge;

/**
 * A training loss (or a parameter) became NaN or infinite. Training stopped at that batch; a
 * checkpoint written after the last good epoch is left as it was, and {@link #getHistory()} holds
 * every epoch completed before the divergent one (so does the trainer's history file, if any).
 */
public class DivergenceException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    private final int epoch;
    private final int batch;
    private final transient History history;

    /**
     * Creates the exception.
     *
     * @param message what diverged, where, and what was kept
     * @param epoch the epoch in which training diverged
     * @param batch the batch (from 0) whose loss was not finite
     * @param history the epochs completed before it
     */
    public DivergenceException(String message, int epoch, int batch, History history) {
        super(message);
        this.epoch = epoch;
        this.batch = batch;
        this.history = history == null ? new History() : history;
    }

    /** @return the epoch in which the loss diverged */
    public int getEpoch() {
        return epoch;
    }

    /** @return the batch (from 0) whose loss was not finite */
    public int getBatch() {
        return batch;
    }

    /** @return every epoch completed before the divergent one (possibly none) */
    public History getHistory() {
        return history;
    }
}
