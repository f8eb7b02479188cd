package dev.gradbridge;

/**
 * A training loss became NaN or infinite. Training stopped at that batch; a checkpoint written
 * after the last good epoch is left as it was.
 */
public class DivergenceException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    private final int epoch;
    private final int batch;

    DivergenceException(String message, int epoch, int batch) {
        super(message);
        this.epoch = epoch;
        this.batch = batch;
    }

    /** @return the epoch in which the loss diverged */
    public int getEpoch() {
        return epoch;
    }

    /** @return the batch (from 0) whose loss was not finite */
    public int getBatch() {
        return batch;
    }
}
