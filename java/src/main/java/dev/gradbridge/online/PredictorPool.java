package dev.gradbridge.online;

import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.TrainingModule;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.function.Supplier;

/**
 * Copies of the module that serve predictions (and check feedback's loss), never the training
 * module: a prediction takes a free copy, sets the whole snapshot of the current version on it
 * when that copy holds an older one, and runs {@code forward}. So a prediction never sees a
 * half-applied step, and as many run at once as there are copies.
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

    /** Loads {@code count} copies of the module; on failure closes those already loaded. */
    PredictorPool(Path modelPath, int count) {
        free = new ArrayBlockingQueue<>(count);
        try {
            for (int i = 0; i < count; i++) {
                Predictor predictor = new Predictor(TrainingModule.load(modelPath));
                all.add(predictor);
                free.add(predictor);
            }
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /** {@code forward(x)} on the version {@code current} gives once a predictor is free. */
    Prediction forward(Supplier<ModelVersion> current, HostTensor x) {
        Predictor predictor = borrow();
        try {
            ModelVersion version = current.get();
            if (predictor.loaded != version) {
                // The whole snapshot, then forward: this predictor never mixes two versions.
                predictor.module.setParameters(version.parameters());
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
    void checkLoss(HostTensor x, HostTensor y) {
        Predictor predictor = borrow();
        try {
            ModuleCalls.evaluate(predictor.module, x, y);
        } catch (GradbridgeException e) {
            throw new InvalidInputException("feedback rejected by the model's loss: " + libtorchReason(e));
        } finally {
            free.add(predictor);
        }
    }

    private Predictor borrow() {
        try {
            return free.take();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new GradbridgeException("interrupted while waiting for a predictor", e);
        }
    }

    /** libtorch's own reason, first line only, without Java or C++ frames (e.g. "index 9 is out of bounds"). */
    static String libtorchReason(Throwable e) {
        String text = String.valueOf(e.getMessage());
        for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
            if (cause.getMessage() != null) {
                text = cause.getMessage();
            }
        }
        String line = text.split("\n", 2)[0].trim();
        int colon = line.lastIndexOf(": ");
        if (line.matches(".*\\b(ai\\.djl|java\\.|dev\\.gradbridge)\\..*") && colon >= 0) {
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
