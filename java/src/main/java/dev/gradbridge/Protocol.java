package dev.gradbridge;

import java.util.Arrays;
import java.util.Collections;
import java.util.List;

/**
 * The training-module protocol, Java side. The source of truth is {@code
 * python/gradbridge/protocol.py}; {@code tests/test_pins.py} reads these constants
 * through JPype and fails when the two languages disagree.
 */
public final class Protocol {

    /**
     * Protocol version that new exports write. Version 2 adds {@link #DATA_PARALLEL_METHODS} and
     * changes nothing else, so every version in {@link #SUPPORTED_VERSIONS} loads and trains.
     */
    public static final int VERSION = 2;
    /** Protocol versions this library reads. */
    public static final List<Integer> SUPPORTED_VERSIONS =
            Collections.unmodifiableList(Arrays.asList(1, 2, 3));
    /**
     * Protocol 3: a training step captured with torch.export as gradbridge's op lists, run op by op by
     * the native layer ({@link OpListEngine}); the file is a zip of {@link #METADATA_FILE} (with
     * {@link #PROGRAM_KEY}), the op lists and the state tensors.
     */
    public static final int EXPORT_VERSION = 3;
    /** The metadata key of a protocol-3 module's program (graphs and state entries). */
    public static final String PROGRAM_KEY = "program";
    /**
     * The op-list version this gradbridge runs (python: oplist.VERSION; the native layer's kOpListVersion);
     * a program of any other is refused in one line.
     */
    public static final int OPLIST_VERSION = 4;
    /** Name of the metadata file stored inside the .pt archive. */
    public static final String METADATA_FILE = "gradbridge.json";
    /** Value of the metadata's {@code format} key. */
    public static final String METADATA_FORMAT = "gradbridge.training-module";

    // A run's defaults, where neither the caller nor a resumed checkpoint gives one: the one place in Java
    // (python: protocol.DEFAULT_*; tests/test_pins.py pins each to its Python twin of the same name).
    /** Epochs a run trains when not set ({@link RunSettings.Builder#optEpochs}). */
    public static final int DEFAULT_EPOCHS = 1;
    /** A run's batch size when not set ({@link RunSettings.Builder#optBatchSize}). */
    public static final int DEFAULT_BATCH_SIZE = 32;
    /** A run's seed when not set ({@link RunSettings.Builder#optSeed}); the online learner's too. */
    public static final long DEFAULT_SEED = 0;
    /** A {@link Trainer}'s mode when not set, as {@link Trainer.Mode#parse} reads it. */
    public static final String DEFAULT_MODE = "step";

    /**
     * How a data-parallel step combines its partitions, as a run's history records it ({@link ShardedRun#getRule}):
     * the sample-weighted sum of the partitions' gradients in partition order, the buffers of the step's first
     * partition with rows, partition k's draws of step s seeded with {@code step_seed(seed, s, k)}; the replay
     * ({@code reference.train_sharded}) does the same and refuses a history of another rule.
     */
    public static final String SHARDED_RULE = "partition-order";

    /** {@code forward(x) -> predictions}. */
    public static final String FORWARD = "forward";
    /** {@code calculate_loss_and_backward(x, y) -> loss}; gradients accumulate. */
    public static final String CALCULATE_LOSS_AND_BACKWARD = "calculate_loss_and_backward";
    /** {@code zero_grad()}. */
    public static final String ZERO_GRAD = "zero_grad";
    /** {@code sgd_step(lr)}: plain SGD, then the gradients are zeroed. */
    public static final String SGD_STEP = "sgd_step";
    /** {@code get_parameters() -> List[Tensor]} in {@code parameter_names()} order. */
    public static final String GET_PARAMETERS = "get_parameters";
    /** {@code parameter_names() -> List[str]}. */
    public static final String PARAMETER_NAMES = "parameter_names";
    /** {@code get_gradients() -> List[Tensor]} in {@code parameter_names()} order. */
    public static final String GET_GRADIENTS = "get_gradients";

    /** {@code optimizer_step()}: the exported optimizer; consumes the gradients. */
    public static final String OPTIMIZER_STEP = "optimizer_step";
    /** {@code train_step(x, y) -> loss}: zero_grad, loss and backward, optimizer step. */
    public static final String TRAIN_STEP = "train_step";
    /** {@code train_epoch(x, y, perm, batch_size) -> batch losses}: one native call per epoch. */
    public static final String TRAIN_EPOCH = "train_epoch";
    /** {@code evaluate(x, y) -> loss} without gradients, in the module's current mode. */
    public static final String EVALUATE = "evaluate";
    /** {@code set_parameters(List[Tensor])} in {@code parameter_names()} order. */
    public static final String SET_PARAMETERS = "set_parameters";
    /** {@code buffer_names() -> List[str]}. */
    public static final String BUFFER_NAMES = "buffer_names";
    /** {@code get_buffers() -> List[Tensor]} in {@code buffer_names()} order. */
    public static final String GET_BUFFERS = "get_buffers";
    /**
     * {@code get_state(List[str]) -> List[Tensor]}: copies of the named parameters and buffers (a version's
     * trainable parameters and trained buffers); absent in modules exported before it.
     */
    public static final String GET_STATE = "get_state";
    /** {@code set_state(List[str], List[Tensor])}: copies values into the named parameters and buffers. */
    public static final String SET_STATE = "set_state";
    /** {@code get_lr() -> float}. */
    public static final String GET_LR = "get_lr";
    /** {@code set_lr(lr)}. */
    public static final String SET_LR = "set_lr";
    /** {@code optimizer_state() -> Dict[str, List[Tensor]]}, torch.optim's state keys. */
    public static final String OPTIMIZER_STATE = "optimizer_state";
    /** {@code load_optimizer_state(Dict[str, List[Tensor]])}. */
    public static final String LOAD_OPTIMIZER_STATE = "load_optimizer_state";

    /** {@code get_lrs()}: every parameter group's learning rate (optional method). */
    public static final String GET_LRS = "get_lrs";

    /** {@code set_group_lr(group, lr)} (optional method). */
    public static final String SET_GROUP_LR = "set_group_lr";

    /** {@code schedule_epoch(metric)}: the per-epoch schedule step (optional method). */
    public static final String SCHEDULE_EPOCH = "schedule_epoch";

    /** {@code gradient_flags() -> Tensor} (bool): which parameters hold a gradient (protocol 2). */
    public static final String GRADIENT_FLAGS = "gradient_flags";

    /**
     * {@code set_gradients(List[Tensor], flags)}: replace the gradient buffers and which of them
     * hold a gradient, e.g. with gradients combined over data-parallel workers (protocol 2).
     */
    public static final String SET_GRADIENTS = "set_gradients";

    /** Methods of protocol 2 that data-parallel training needs; version-1 modules lack them. */
    public static final List<String> DATA_PARALLEL_METHODS =
            Collections.unmodifiableList(Arrays.asList(GRADIENT_FLAGS, SET_GRADIENTS));

    /** Methods modules exported with fine-tuning support have; older modules lack them. */
    public static final List<String> OPTIONAL_METHODS =
            Collections.unmodifiableList(Arrays.asList(GET_LRS, SET_GROUP_LR, SCHEDULE_EPOCH, GET_STATE, SET_STATE));

    /** Methods every protocol-v1 module has. */
    public static final List<String> REQUIRED_METHODS =
            Collections.unmodifiableList(
                    Arrays.asList(
                            FORWARD,
                            CALCULATE_LOSS_AND_BACKWARD,
                            ZERO_GRAD,
                            SGD_STEP,
                            GET_PARAMETERS,
                            PARAMETER_NAMES,
                            GET_GRADIENTS,
                            OPTIMIZER_STEP,
                            TRAIN_STEP,
                            TRAIN_EPOCH,
                            EVALUATE,
                            SET_PARAMETERS,
                            BUFFER_NAMES,
                            GET_BUFFERS,
                            GET_LR,
                            SET_LR,
                            OPTIMIZER_STATE,
                            LOAD_OPTIMIZER_STATE));

    private Protocol() {}
}
