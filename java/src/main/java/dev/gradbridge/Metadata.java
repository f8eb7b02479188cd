package dev.gradbridge;

import com.google.gson.FieldNamingPolicy;
import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;

/**
 * The {@code gradbridge.json} document stored inside an exported .pt (schema: {@code
 * python/gradbridge/protocol.py}). Read straight from the archive, so it is known before libtorch
 * loads anything.
 */
public final class Metadata {

    /** The document's JSON names ({@code protocol_version}) as the fields' ({@code protocolVersion}). */
    static final Gson GSON =
            new GsonBuilder()
                    .setFieldNamingPolicy(FieldNamingPolicy.LOWER_CASE_WITH_UNDERSCORES)
                    .create();

    // package-private where MetadataArchive fills or checks them (Gson sets them all)
    String format;
    int protocolVersion;
    private String gradbridgeVersion;
    private String torchVersion;
    private String model;
    List<String> methods;
    List<TensorSpec> parameters;
    private List<TensorSpec> buffers;
    private Map<String, Object> loss;
    private Map<String, Object> optimizer;
    List<TensorSpec> inputs;
    private List<String> customOps;
    Checkpoint checkpoint;
    private Map<String, Object> fineTuning;
    private Map<String, Object> capture; // absent in modules exported before the export's check
    private JsonObject program; // protocol 3 only: the graphs and state entries (OpListEngine reads them)
    transient JsonObject document;

    private Metadata() {}

    /**
     * Present in checkpoints written by the Java Trainer: where training stopped, so that a
     * resumed run continues the same epoch sequence (shuffle and torch seed per epoch).
     */
    public static final class Checkpoint {
        private int epochsCompleted;
        private long seed;
        // What the run depends on (absent in checkpoints of older versions: then not checked).
        private Integer batchSize;
        private String mode;
        private long[] xShape;
        private long[] yShape;
        private String dataSha256;
        // gradbridge-spark's runs instead of dataSha256: over the K partitions' digests.
        private String shardsSha256;
        // The keys the entry held when it was read (non-null values); null for an entry made here.
        transient java.util.Set<String> keys;

        private Checkpoint() {}

        /**
         * Whether the entry holds a key: as read from a file (an edited checkpoint may lack any), or, for
         * an entry made in this process, as it would be written.
         *
         * @param key a key of the entry as {@code gradbridge.json} spells it, e.g. {@code data_sha256}
         * @return whether it is there, with a value other than null
         */
        public boolean has(String key) {
            return keys != null ? keys.contains(key) : GSON.toJsonTree(this).getAsJsonObject().has(key);
        }

        /**
         * A checkpoint written outside a Trainer run (the online learner's): progress only, no run
         * settings, so a resume checks none.
         *
         * @param epochsCompleted epochs (or, for the online learner, versions) completed
         * @param seed the seed, 0 when there is none
         * @return the checkpoint entry
         */
        public static Checkpoint progress(int epochsCompleted, long seed) {
            Checkpoint checkpoint = new Checkpoint();
            checkpoint.epochsCompleted = epochsCompleted;
            checkpoint.seed = seed;
            return checkpoint;
        }

        /**
         * Describes where a run stands.
         *
         * @param epochsCompleted epochs trained so far
         * @param seed the run's seed
         * @param batchSize the run's batch size
         * @param mode the run's mode ({@code full}, {@code step}, {@code fused})
         * @param xShape the training inputs' shape
         * @param yShape the training targets' shape
         * @param dataSha256 SHA-256 of the training data's bytes (x, then y)
         */
        public Checkpoint(
                int epochsCompleted, long seed, int batchSize, String mode, long[] xShape, long[] yShape,
                String dataSha256) {
            this.epochsCompleted = epochsCompleted;
            this.seed = seed;
            this.batchSize = batchSize;
            this.mode = mode;
            this.xShape = xShape.clone();
            this.yShape = yShape.clone();
            this.dataSha256 = dataSha256;
        }

        /** @return epochs trained before the checkpoint was written */
        public int getEpochsCompleted() {
            return epochsCompleted;
        }

        /** @return the run's seed */
        public long getSeed() {
            return seed;
        }

        /** @return the run's batch size, or {@code null} when the checkpoint does not say */
        public Integer getBatchSize() {
            return batchSize;
        }

        /** @return the run's mode name, or {@code null} when the checkpoint does not say */
        public String getMode() {
            return mode;
        }

        /** @return the training inputs' shape, or {@code null} */
        public long[] getXShape() {
            return xShape == null ? null : xShape.clone();
        }

        /** @return the training targets' shape, or {@code null} */
        public long[] getYShape() {
            return yShape == null ? null : yShape.clone();
        }

        /** @return SHA-256 of the training data (x bytes, then y bytes), or {@code null} */
        public String getDataSha256() {
            return dataSha256;
        }

        /**
         * A data-parallel run's checkpoint: its data named by {@code shardsSha256} (SHA-256 over the
         * SHA-256 of each partition's x bytes then y bytes, in partition order), not {@code dataSha256}.
         *
         * @param epochsCompleted epochs trained so far
         * @param seed the run's seed
         * @param batchSize the run's batch size
         * @param mode the run's mode
         * @param xShape the training inputs' shape
         * @param yShape the training targets' shape
         * @param shardsSha256 the partitions' digest
         * @return the checkpoint entry
         */
        public static Checkpoint sharded(int epochsCompleted, long seed, int batchSize, String mode, long[] xShape,
                long[] yShape, String shardsSha256) {
            Checkpoint checkpoint = new Checkpoint(epochsCompleted, seed, batchSize, mode, xShape, yShape, null);
            checkpoint.shardsSha256 = shardsSha256;
            return checkpoint;
        }

        /** @return the partitions' digest of a data-parallel run, or {@code null} */
        public String getShardsSha256() {
            return shardsSha256;
        }
    }

    /** A named tensor: shape ({@code -1} marks the batch dimension) and dtype name. */
    public static final class TensorSpec {
        private String name;
        private long[] shape;
        private String dtype;
        private Boolean trainable; // absent in modules exported before frozen parameters
        private Boolean persistent; // buffers only; absent in modules exported before it
        private Boolean trained; // buffers only; absent in modules exported before it

        /** @return the tensor's name */
        public String getName() {
            return name;
        }

        /** @return the shape; {@code -1} marks the batch dimension */
        public long[] getShape() {
            return shape.clone();
        }

        /** @return torch's dtype name, e.g. {@code float32} */
        public String getDtype() {
            return dtype;
        }

        /**
         * @return whether the parameter trains ({@code false}: frozen, {@code requires_grad=False}:
         *     no gradient, no optimizer state, never changes); {@code true} for buffers and inputs
         */
        public boolean isTrainable() {
            return trainable == null || trainable;
        }

        /**
         * @return whether the buffer is in the model's {@code state_dict()} ({@code false}: registered
         *     with {@code persistent=False}, e.g. a causal mask); {@code true} for parameters and inputs
         */
        public boolean isPersistent() {
            return persistent == null || persistent;
        }

        /**
         * @return whether a training step writes the buffer (BatchNorm's running statistics): online
         *     versions and Spark partitions carry it with the parameters; {@code false} for a constant
         *     buffer (rotary frequencies, position ids, masks). {@code true} for buffers of modules
         *     exported before it was recorded.
         */
        public boolean isTrained() {
            return trained == null || trained;
        }

        /**
         * Whether an array fits: the same dtype and rank, and every dimension but the first
         * (the batch) equal.
         *
         * @param arrayDtype the array's dtype name
         * @param arrayShape the array's shape
         * @return whether the array matches this spec
         */
        public boolean accepts(String arrayDtype, long[] arrayShape) {
            if (!dtype.equals(arrayDtype) || arrayShape.length != shape.length) {
                return false;
            }
            for (int i = 1; i < shape.length; i++) {
                if (shape[i] != arrayShape[i]) {
                    return false;
                }
            }
            return true;
        }

        @Override
        public String toString() {
            return name + " " + dtype + Arrays.toString(shape);
        }
    }

    /**
     * Reads and checks the metadata of an exported training module.
     *
     * @param path the .pt file
     * @return the metadata
     * @throws ModuleLoadException when the file is missing or not a TorchScript archive
     * @throws ProtocolException when the archive has no valid gradbridge metadata
     */
    public static Metadata read(Path path) {
        return MetadataArchive.read(path);
    }

    /** @return protocol version of the module */
    public int getProtocolVersion() {
        return protocolVersion;
    }

    /** @return the gradbridge version that exported the module */
    public String getGradbridgeVersion() {
        return gradbridgeVersion;
    }

    /** @return the torch version that exported the module */
    public String getTorchVersion() {
        return torchVersion;
    }

    /** @return the model's name (a built-in name or the class name) */
    public String getModel() {
        return model;
    }

    /** @return the protocol methods the exporter wrote */
    public List<String> getMethods() {
        return Collections.unmodifiableList(methods);
    }

    /** @return parameter specs in protocol order */
    public List<TensorSpec> getParameters() {
        return Collections.unmodifiableList(parameters);
    }

    /** @return buffer specs (e.g. BatchNorm running statistics) */
    public List<TensorSpec> getBuffers() {
        return buffers == null ? Collections.emptyList() : Collections.unmodifiableList(buffers);
    }

    /** @return loss name and options, e.g. {@code {name=mse, reduction=mean}} */
    public Map<String, Object> getLoss() {
        return Collections.unmodifiableMap(loss);
    }

    /** @return optimizer name and hyper-parameters, e.g. {@code {name=sgd, lr=0.01}} */
    public Map<String, Object> getOptimizer() {
        return Collections.unmodifiableMap(optimizer);
    }

    /** @return the specs of the model's inputs ({@code x}, or several by name), then the target's ({@code y}) */
    public List<TensorSpec> getInputs() {
        return Collections.unmodifiableList(inputs);
    }

    /**
     * @return the model's input names in order: {@code [x]} for a model of one input tensor, else
     *     the names its forward takes them by (e.g. {@code [input_ids, attention_mask]})
     */
    public List<String> getInputNames() {
        List<String> names = new java.util.ArrayList<>();
        for (TensorSpec spec : inputs.subList(0, inputs.size() - 1)) {
            names.add(spec.getName());
        }
        return Collections.unmodifiableList(names);
    }

    /**
     * @return whether the model takes several named inputs (its methods then take a list of
     *     tensors in {@link #getInputNames()} order), rather than the one tensor {@code x}
     */
    public boolean hasNamedInputs() {
        return !(inputs.size() == 2 && inputs.get(0).getName().equals("x"));
    }

    /**
     * @return the custom operators ({@code NS::NAME}) the module calls, whose libraries must be
     *     loaded before it (empty for modules of libtorch's operators only, or older exports)
     */
    public List<String> getCustomOps() {
        return customOps == null ? Collections.emptyList() : Collections.unmodifiableList(customOps);
    }

    /**
     * The export's fine-tuning options: {@code scheduler}, {@code scheduler_interval}, {@code clip},
     * {@code accumulate} (each only when set).
     *
     * @return the options, empty when none were set
     */
    public Map<String, Object> getFineTuning() {
        return fineTuning == null ? Collections.<String, Object>emptyMap() : Collections.unmodifiableMap(fineTuning);
    }

    /**
     * How the export captured the model: {@code kind} ({@code script} or {@code trace}) and
     * {@code checked} (whether it was checked against the eager model bit for bit before it was written).
     *
     * @return the capture, empty for modules exported before it was recorded
     */
    public Map<String, Object> getCapture() {
        return capture == null ? Collections.<String, Object>emptyMap() : Collections.unmodifiableMap(capture);
    }

    /**
     * @return the smallest batch the module runs: 1, or for a protocol-3 module whose export could not
     *     capture a batch of one sample (torch.export specializes on size 1) its program's {@code min_batch}
     */
    public int getMinBatch() {
        JsonElement minimum = program == null ? null : program.get("min_batch");
        return minimum == null || !minimum.isJsonPrimitive() ? 1 : minimum.getAsInt();
    }

    /** @return the names of the buffers a training step writes ({@link TensorSpec#isTrained}), in protocol order */
    public List<String> getTrainedBufferNames() {
        List<String> names = new java.util.ArrayList<>();
        for (TensorSpec spec : getBuffers()) {
            if (spec.isTrained()) {
                names.add(spec.getName());
            }
        }
        return names;
    }

    /**
     * @return whether a training step draws from libtorch's generator (dropout): such steps are seeded
     *     one by one where several run in a process ({@code capture.draws_random}; true for modules
     *     exported before it was recorded)
     */
    public boolean drawsRandom() {
        Object draws = getCapture().get("draws_random");
        return !(draws instanceof Boolean) || (Boolean) draws;
    }

    /** @return names of the parameters that train, in protocol order */
    public List<String> getTrainableParameterNames() {
        List<String> names = new java.util.ArrayList<>();
        for (TensorSpec spec : parameters) {
            if (spec.isTrainable()) {
                names.add(spec.getName());
            }
        }
        return Collections.unmodifiableList(names);
    }

    /** @return where a checkpoint's training stopped, or {@code null} for a fresh export */
    public Checkpoint getCheckpoint() {
        return checkpoint;
    }

    /**
     * The document with a {@code checkpoint} entry, for the metadata of a saved checkpoint.
     *
     * @param checkpoint where the run stands and what it depends on
     * @return gradbridge.json text
     */
    String withCheckpoint(Checkpoint checkpoint) {
        JsonObject copy = document.deepCopy();
        copy.add("checkpoint", GSON.toJsonTree(checkpoint));
        return new GsonBuilder().setPrettyPrinting().create().toJson(copy);
    }

    /**
     * Returns one input spec by name.
     *
     * @param name an input's name ({@link #getInputNames()}) or {@code y}
     * @return the spec
     * @throws ProtocolException when the metadata has no such input
     */
    public TensorSpec getInput(String name) {
        for (TensorSpec spec : inputs) {
            if (spec.name.equals(name)) {
                return spec;
            }
        }
        throw new ProtocolException("metadata has no input named '" + name + "'");
    }
}
