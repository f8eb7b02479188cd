package dev.gradbridge;

import java.util.Map;
import java.util.Set;
import java.util.function.Supplier;

/**
 * What {@link TrainingModule}'s typed protocol calls run once it holds its thread guard: inputs checked
 * against the metadata ({@link ModuleInputs}), learning rates checked, eval mode around the calls that
 * predict or evaluate, and the hot paths of a one-tensor model ({@link ModuleEngine}'s calls that return
 * a double or an array without a result tensor).
 */
final class TypedCalls {

    private final ModuleEngine scripted;
    private final ModuleInputs inputs;
    private final Set<String> methodNames;
    private boolean evalOnly; // a predictor: eval mode for good (keepEvalMode); read under the thread guard

    TypedCalls(ModuleEngine scripted, ModuleInputs inputs, Set<String> methodNames) {
        this.scripted = scripted;
        this.inputs = inputs;
        this.methodNames = methodNames;
    }

    /**
     * From now on the module stays in eval mode (a predictor, which never trains): {@link #forward},
     * {@link #predict} and {@link #evaluate} no longer switch modes around each call (two calls into
     * the engine per prediction).
     */
    void keepEvalMode() {
        scripted.setTraining(false);
        evalOnly = true;
    }

    Tensor forward(Map<String, Tensor> x) {
        Object argument = inputs.argument(Protocol.FORWARD, x, null, false);
        return inEvalMode(() -> (Tensor) scripted.invoke(Protocol.FORWARD, argument));
    }

    Tensor predict(Map<String, Tensor> x) {
        Object argument = inputs.argument(Protocol.FORWARD, x, null, false);
        if (argument instanceof Tensor) {
            return inEvalMode(() -> scripted.infer(Protocol.FORWARD, (Tensor) argument));
        }
        return inEvalMode(() -> (Tensor) scripted.invoke(Protocol.FORWARD, argument));
    }

    /** A method that returns a scalar loss: {@code calculate_loss_and_backward}, {@code train_step}. */
    double scalarLoss(String method, Map<String, Tensor> x, Tensor y) {
        Object argument = inputs.argument(method, x, y, true);
        if (argument instanceof Tensor) {
            return scripted.invokeToDouble(method, (Tensor) argument, y); // the hot path: see ModuleEngine
        }
        try (Tensor loss = (Tensor) scripted.invoke(method, argument, y)) {
            return loss.toExactDoubles()[0];
        }
    }

    double evaluate(Map<String, Tensor> x, Tensor y) {
        return inEvalMode(() -> scalarLoss(Protocol.EVALUATE, x, y));
    }

    double[] trainEpoch(Map<String, Tensor> x, Tensor y, Tensor perm, int batchSize) {
        Object argument = inputs.argument(Protocol.TRAIN_EPOCH, x, y, true);
        ModuleInputs.checkEpoch(perm, batchSize, ModuleInputs.rows(argument));
        if (argument instanceof Tensor) {
            return scripted.invokeToDoubles(Protocol.TRAIN_EPOCH, (Tensor) argument, y, perm, batchSize);
        }
        try (Tensor losses = (Tensor) scripted.invoke(Protocol.TRAIN_EPOCH, argument, y, perm, (long) batchSize)) {
            return losses.toExactDoubles();
        }
    }

    /** Checks x and y against the metadata and each other; returns the number of samples. */
    long checkBatch(String method, Tensor x, Tensor y) {
        return ModuleInputs.rows(inputs.argument(method, inputs.single(method, x), y, true));
    }

    void sgdStep(double lr) {
        if (!(lr > 0) || Double.isInfinite(lr)) {
            throw new InvalidInputException(Protocol.SGD_STEP + ": invalid learning rate " + lr);
        }
        scripted.invoke(Protocol.SGD_STEP, lr);
    }

    void setLr(double lr) {
        if (!(lr >= 0) || Double.isInfinite(lr)) {
            throw new InvalidInputException(Protocol.SET_LR + ": invalid learning rate " + lr);
        }
        scripted.invoke(Protocol.SET_LR, lr);
    }

    /** {@code schedule_epoch(metric)}, where the module has it. */
    void scheduleEpoch(double metric) {
        if (methodNames.contains(Protocol.SCHEDULE_EPOCH)) {
            scripted.invoke(Protocol.SCHEDULE_EPOCH, metric);
        }
    }

    /** Runs {@code call} with the module in eval mode, then returns it to training mode (unless it stays in eval). */
    private <T> T inEvalMode(Supplier<T> call) {
        if (evalOnly) {
            return call.get();
        }
        scripted.setTraining(false);
        try {
            return call.get();
        } finally {
            scripted.setTraining(true);
        }
    }
}
