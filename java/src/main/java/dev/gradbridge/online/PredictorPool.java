package dev.gradbridge.online;

import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.internal.FrozenTensors;
import dev.gradbridge.internal.ModuleAccess;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Copies of the module that serve predictions (and check feedback's loss), never the training
 * module: a prediction takes a free copy, sets the whole snapshot of the current version on it
 * when that copy holds an older one, and runs {@code forward}. So a prediction never sees a
 * half-applied step, and as many run at once as there are copies.
 *
 * <p>The copies hold the training module's frozen tensors (frozen parameters, constant buffers) in place
 * of their own: N predictors of a LoRA model hold one copy of its base, the learner's. Nothing writes
 * them: training gives them no gradient, no optimizer state and no version, a version sets what training
 * changed, and a predictor runs in eval mode (no statistics updated).
 */
final class PredictorPool implements AutoCloseable {

    /** One copy of the module and what only its borrower touches. */
    private static final class Predictor {
        final TrainingModule module;
        ModelVersion loaded; // the version whose parameters it holds
        final ByteBuffer[] input = new ByteBuffer[1]; // its input buffer, reused

        Predictor(TrainingModule module) {
            this.module = module;
        }
    }

    private final BlockingQueue<Predictor> free;
    private final List<Predictor> all = new ArrayList<>();

    /**
     * Loads {@code count} copies of the module, each holding {@code frozen} in place of its own (freed as
     * soon as it is loaded); on failure closes those already loaded.
     */
    PredictorPool(Path modelPath, int count, FrozenTensors frozen) {
        free = new ArrayBlockingQueue<>(count);
        try {
            for (int i = 0; i < count; i++) {
                Predictor predictor = new Predictor(TrainingModule.load(modelPath));
                all.add(predictor);
                ModuleAccess.share(predictor.module, frozen);
                ModuleAccess.keepEvalMode(predictor.module); // predictors never train: no mode switch per call
                free.add(predictor);
            }
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /** {@code forward(x)} on the version {@code current} gives once a predictor is free. */
    Prediction forward(Supplier<ModelVersion> current, Map<String, HostTensor> x) {
        Predictor predictor = borrow();
        try {
            ModelVersion version = current.get();
            if (predictor.loaded != version) {
                // The whole snapshot, then forward: this predictor never mixes two versions.
                version.applyTo(predictor.module); // what training changed; the frozen rest stays
                predictor.loaded = version;
            }
            try {
                return new Prediction(version.getId(), ModuleCalls.forward(predictor.module, x, predictor.input));
            } catch (GradbridgeException e) {
                throw new InvalidInputException("x rejected by the model: " + libtorchReason(e));
            }
        } finally {
            free.add(predictor);
        }
    }

    /** The loss, no step: a libtorch error (e.g. a class index out of range) refuses the feedback. */
    void checkLoss(Map<String, HostTensor> x, HostTensor y) {
        Predictor predictor = borrow();
        try {
            ModuleCalls.evaluate(predictor.module, x, y);
        } catch (GradbridgeException e) {
            throw new InvalidInputException("feedback rejected by the model's loss: " + libtorchReason(e));
        } finally {
            free.add(predictor);
        }
    }

    /** @return the predictors' modules (tests: whether they share the frozen tensors) */
    List<TrainingModule> modules() {
        List<TrainingModule> modules = new ArrayList<>();
        for (Predictor predictor : all) {
            modules.add(predictor.module);
        }
        return modules;
    }

    private Predictor borrow() {
        try {
            return free.take();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new GradbridgeException("interrupted while waiting for a predictor", e);
        }
    }

    private static final Pattern ERROR_LINE = Pattern.compile("^\\s*(?:[\\w.]*\\.)?\\w*(?:Error|Exception): (.+)$");

    /**
     * libtorch's own reason, one line, without Java or C++ frames (e.g. "Target 99 is out of
     * bounds."): TorchScript puts "The following operation failed in the TorchScript interpreter."
     * and a traceback first and the error ({@code RuntimeError: ...}) after them.
     */
    static String libtorchReason(Throwable e) {
        String text = String.valueOf(e.getMessage());
        for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
            if (cause.getMessage() != null) {
                text = cause.getMessage();
            }
        }
        String[] lines = text.split("\n");
        String line = null;
        for (int i = lines.length - 1; i >= 0 && line == null; i--) { // the last "XxxError: reason" line
            Matcher error = ERROR_LINE.matcher(lines[i]);
            if (error.matches() && !error.group(1).trim().isEmpty()) {
                line = error.group(1).trim();
            }
        }
        if (line == null) {
            line = lines[0].trim();
            if (line.startsWith("The following operation failed in the TorchScript interpreter")) {
                for (int i = lines.length - 1; i > 0; i--) { // else the last line that says something
                    if (!lines[i].trim().isEmpty()) {
                        line = lines[i].trim();
                        break;
                    }
                }
            }
        }
        int colon = line.lastIndexOf(": ");
        if (line.matches(".*\\b(java\\.|dev\\.gradbridge)\\..*") && colon >= 0) {
            line = line.substring(colon + 2);
        }
        return line.length() > 200 ? line.substring(0, 200) + "..." : line;
    }

    @Override
    public void close() {
        for (Predictor predictor : all) {
            predictor.module.close();
        }
    }
}
