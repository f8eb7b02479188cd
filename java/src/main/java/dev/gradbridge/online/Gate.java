package dev.gradbridge.online;

import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.ValueRanges;
import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;

/**
 * A publish gate: a version is published only when its loss on the gate data ({@code evaluate}, in
 * eval mode, the whole data in one call as a validation loss is computed) is at most the serving
 * version's plus {@code maxRegression}. The comparison is one IEEE double sum and compare, and the
 * losses come from the same libtorch calls on the same parameters, so a restart and the eager
 * replay ({@code gradbridge replay}) take the same decisions; both losses are logged anyway and
 * checked when the log is applied again.
 */
final class Gate implements AutoCloseable {

    private final Path file;
    private final String sha256;
    private final double maxRegression;
    private final HoldPolicy onHold;
    private final int keepVersions;
    private final Dataset data;

    private Gate(Path file, String sha256, double maxRegression, HoldPolicy onHold, int keepVersions, Dataset data) {
        this.file = file;
        this.sha256 = sha256;
        this.maxRegression = maxRegression;
        this.onHold = onHold;
        this.keepVersions = keepVersions;
        this.data = data;
    }

    /**
     * Reads the gate data and checks it against the module (arrays, dtypes, shapes, finite values)
     * and its loss (the module's {@code evaluate} must give a finite loss on it).
     *
     * @throws InvalidInputException naming the file when it does not fit
     */
    static Gate open(Path file, double maxRegression, HoldPolicy onHold, int keepVersions, TrainingModule module) {
        Path absolute = file.toAbsolutePath();
        Dataset data = Dataset.loadNpz(absolute);
        try {
            Metadata metadata = module.getMetadata();
            data.check(metadata);
            Gate gate = new Gate(absolute, Digests.sha256Hex(absolute), maxRegression, onHold, keepVersions, data);
            double loss;
            try {
                loss = gate.loss(module);
            } catch (GradbridgeException e) {
                // an id or label the model cannot take: the line names the array (ValueRanges)
                String line = ValueRanges.check(module, data.getSource(), ValueRanges.columns(data));
                throw new InvalidInputException("--gate-data " + (line != null ? line
                        : absolute + " is rejected by the model's loss: " + PredictorPool.libtorchReason(e)));
            }
            if (!Double.isFinite(loss)) {
                throw new InvalidInputException("--gate-data " + absolute + ": the model's loss on it is " + loss
                        + "; a gate needs a finite loss to compare versions by");
            }
            return gate;
        } catch (IOException e) {
            data.close();
            throw new UncheckedIOException(e);
        } catch (RuntimeException e) {
            data.close();
            throw e;
        }
    }

    /** @return {@code module}'s loss on the gate data, in eval mode */
    double loss(TrainingModule module) {
        return module.evaluate(data.getInputs(), data.getY());
    }

    /** @return whether a version of gate loss {@code loss} may replace one of {@code servingLoss} (NaN never) */
    boolean passes(double loss, double servingLoss) {
        return loss <= servingLoss + maxRegression;
    }

    double maxRegression() {
        return maxRegression;
    }

    HoldPolicy onHold() {
        return onHold;
    }

    int keepVersions() {
        return keepVersions;
    }

    /** @return the settings the log's header keeps */
    LogHeader.GateSettings settings() {
        return new LogHeader.GateSettings(file.toString(), sha256, maxRegression, onHold.label(), keepVersions);
    }

    @Override
    public void close() {
        data.close();
    }
}
