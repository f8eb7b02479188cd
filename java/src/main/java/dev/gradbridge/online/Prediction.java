package dev.gradbridge.online;

/** The output of {@code forward(x)} and the version that computed it. */
public final class Prediction {

    private final long version;
    private final HostTensor output;

    Prediction(long version, HostTensor output) {
        this.version = version;
        this.output = output;
    }

    /** @return the id of the published version the prediction ran on */
    public long getVersion() {
        return version;
    }

    /** @return the model's output */
    public HostTensor getOutput() {
        return output;
    }
}
