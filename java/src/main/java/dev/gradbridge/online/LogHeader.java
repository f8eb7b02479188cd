package dev.gradbridge.online;

import com.google.gson.Gson;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;

/**
 * The log's first record: which model it belongs to (name and SHA-256 of the exported file), the
 * version cadence, the update guard, the per-sample dtype and shape of x and y, the first event's
 * sequence number and the smallest one new events may take (in a log recovered from a damaged
 * one: above every number the damaged log may have used, so numbers never repeat).
 * Everything that decides what replaying the log computes is here, so a service restarted with
 * other settings is refused instead of silently computing something else.
 */
final class LogHeader {

    private static final Gson GSON = new Gson();

    private final String model;
    private final String modelSha256;
    private final int publishEvery;
    private final double maxGradNorm;
    private final long firstSeq;
    private final long seqFloor;
    private final String xDtype;
    private final long[] xShape;
    private final String yDtype;
    private final long[] yShape;
    private GateSettings gate; // null: no publish gate (set once, by withGate)
    private List<InputSpec> inputs; // null: one input x (set once, by withInputs)
    private Long seed; // the run's seed of dropout's draws; null in logs written before it (draws unseeded)

    /** x's dtype in the header of a module of several inputs: x is then one event's raw bytes, split as {@code inputs} says. */
    static final String NAMED_INPUTS = "named";

    /** One of several named inputs: its name, dtype and per-sample shape; an event holds their rows in this order. */
    static final class InputSpec {
        private final String name;
        private final String dtype;
        private final long[] shape;

        /**
         * @param name the input's name
         * @param dtype its dtype
         * @param shape one sample's shape (without the batch dimension)
         */
        InputSpec(String name, String dtype, long[] shape) {
            this.name = name;
            this.dtype = dtype;
            this.shape = shape.clone();
        }

        JsonObject toJson() {
            JsonObject json = spec(dtype, shape);
            json.addProperty("name", name);
            return json;
        }
    }

    /**
     * A publish gate's settings, kept in the header: they decide which versions are published,
     * so a restart with others is refused like one with another {@code publish_every}.
     */
    static final class GateSettings {
        private final String data;
        private final String dataSha256;
        private final double maxRegression;
        private final String onHold;
        private final int keepVersions;

        /**
         * @param data the gate data file (for the replay to find it; not compared)
         * @param dataSha256 SHA-256 (hex) of the gate data file
         * @param maxRegression a version is published when its gate loss is at most the serving
         *     version's plus this
         * @param onHold what a held-back version does to the learner ({@code continue} or {@code rollback})
         * @param keepVersions published versions kept for rollbacks
         */
        GateSettings(String data, String dataSha256, double maxRegression, String onHold, int keepVersions) {
            this.data = data;
            this.dataSha256 = dataSha256;
            this.maxRegression = maxRegression;
            this.onHold = onHold;
            this.keepVersions = keepVersions;
        }

        /** @return the gate data file as given when the log was started */
        String getData() {
            return data;
        }

        /** @return SHA-256 (hex) of the gate data file */
        String getDataSha256() {
            return dataSha256;
        }

        /** @return the largest gate-loss regression a published version may have */
        double getMaxRegression() {
            return maxRegression;
        }

        /** @return {@code continue} or {@code rollback} */
        String getOnHold() {
            return onHold;
        }

        /** @return published versions kept for rollbacks */
        int getKeepVersions() {
            return keepVersions;
        }

        JsonObject toJson() {
            JsonObject json = new JsonObject();
            json.addProperty("data", data);
            json.addProperty("data_sha256", dataSha256);
            json.addProperty("max_regression", maxRegression);
            json.addProperty("on_hold", onHold);
            json.addProperty("keep_versions", keepVersions);
            return json;
        }

        /** The settings that decide what the log computes (not the file's path: it may move). */
        String decisive() {
            JsonObject json = toJson();
            json.remove("data");
            return GSON.toJson(json);
        }
    }

    /**
     * Creates a header.
     *
     * @param model the model's name (metadata {@code model})
     * @param modelSha256 SHA-256 (hex) of the exported module file the log starts from
     * @param publishEvery a version every this many updates
     * @param maxGradNorm updates whose gradient norm exceeds this are quarantined; 0: no limit
     * @param firstSeq the first event's sequence number (0 unless written by a tool)
     * @param seqFloor the smallest sequence number a new event may take
     * @param xDtype x's dtype
     * @param xShape one sample's x shape (without the batch dimension)
     * @param yDtype y's dtype
     * @param yShape one sample's y shape (without the batch dimension)
     */
    LogHeader(String model, String modelSha256, int publishEvery, double maxGradNorm, long firstSeq,
            long seqFloor, String xDtype, long[] xShape, String yDtype, long[] yShape) {
        this.model = model;
        this.modelSha256 = modelSha256;
        this.publishEvery = publishEvery;
        this.maxGradNorm = maxGradNorm;
        this.firstSeq = firstSeq;
        this.seqFloor = seqFloor;
        this.xDtype = xDtype;
        this.xShape = xShape.clone();
        this.yDtype = yDtype;
        this.yShape = yShape.clone();
    }

    /**
     * @param settings the publish gate's settings
     * @return this header with them
     */
    LogHeader withGate(GateSettings settings) {
        this.gate = settings;
        return this;
    }

    /**
     * @param specs a module of several inputs: each input's name, dtype and shape, in the order an event holds them
     * @return this header with them
     */
    LogHeader withInputs(List<InputSpec> specs) {
        this.inputs = new ArrayList<>(specs);
        return this;
    }

    /**
     * @param runSeed the run's seed: micro-batch {@code i}'s draws come from libtorch's generator seeded with
     *     {@code SeededDraws.seed(runSeed, first event's sequence number)}
     * @return this header with it
     */
    LogHeader withSeed(long runSeed) {
        this.seed = runSeed;
        return this;
    }

    /** @return the run's seed, or null for a log written before micro-batches were seeded */
    Long getSeed() {
        return seed;
    }

    /** @return the publish gate's settings, or null when the learner has no gate */
    GateSettings getGate() {
        return gate;
    }

    /** @return the model's name */
    String getModel() {
        return model;
    }

    /** @return SHA-256 (hex) of the exported module the log starts from */
    String getModelSha256() {
        return modelSha256;
    }

    /** @return a version every this many updates */
    int getPublishEvery() {
        return publishEvery;
    }

    /** @return the gradient-norm guard, 0 when off */
    double getMaxGradNorm() {
        return maxGradNorm;
    }

    /** @return the first sequence number this log may use */
    long getFirstSeq() {
        return firstSeq;
    }

    /** @return x's dtype */
    String getXDtype() {
        return xDtype;
    }

    /** @return one sample's x shape */
    long[] getXShape() {
        return xShape.clone();
    }

    /** @return y's dtype */
    String getYDtype() {
        return yDtype;
    }

    /** @return one sample's y shape */
    long[] getYShape() {
        return yShape.clone();
    }

    /** @return the smallest sequence number a new event may take */
    long getSeqFloor() {
        return seqFloor;
    }

    /**
     * Why a log with this header cannot continue as {@code wanted}, or null when it can (the
     * sequence numbers may differ: they belong to the log).
     *
     * @param wanted the header the caller would write
     * @return a phrase naming the first difference, or null
     */
    String mismatch(LogHeader wanted) {
        if (!modelSha256.equals(wanted.modelSha256)) {
            return "it was written for the module with SHA-256 " + modelSha256 + " (" + model + "), not "
                    + wanted.modelSha256 + " (" + wanted.model + "); start another log folder for another --model";
        }
        if (publishEvery != wanted.publishEvery) {
            return "it was written with --publish-every " + publishEvery + ", not " + wanted.publishEvery;
        }
        if (Double.compare(maxGradNorm, wanted.maxGradNorm) != 0) {
            return "it was written with --max-grad-norm " + maxGradNorm + ", not " + wanted.maxGradNorm;
        }
        if (seed != null && wanted.seed != null && !seed.equals(wanted.seed)) {
            return "it was written with --seed " + seed + ", not " + wanted.seed;
        }
        String gateNow = gate == null ? "no gate" : gate.decisive();
        String gateWanted = wanted.gate == null ? "no gate" : wanted.gate.decisive();
        if (!gateNow.equals(gateWanted)) {
            return "it was written with publish gate " + gateNow + ", not " + gateWanted
                    + " (--gate-data, --gate-max-regression, --gate-on-hold, --keep-versions); start another log folder"
                    + " for other gate settings";
        }
        if (!xDtype.equals(wanted.xDtype) || !Arrays.equals(xShape, wanted.xShape)
                || !yDtype.equals(wanted.yDtype) || !Arrays.equals(yShape, wanted.yShape)
                || !String.valueOf(inputsJson()).equals(String.valueOf(wanted.inputsJson()))) {
            return "it holds samples of another shape (" + toJson() + ")";
        }
        return null;
    }

    String toJson() {
        JsonObject json = new JsonObject();
        json.addProperty("format", LogFormat.FORMAT);
        json.addProperty("version", LogFormat.FORMAT_VERSION);
        json.addProperty("model", model);
        json.addProperty("model_sha256", modelSha256);
        json.addProperty("publish_every", publishEvery);
        json.addProperty("max_grad_norm", maxGradNorm);
        json.addProperty("first_seq", firstSeq);
        json.addProperty("seq_floor", seqFloor);
        json.add("x", spec(xDtype, xShape));
        json.add("y", spec(yDtype, yShape));
        if (inputs != null) {
            json.add("inputs", inputsJson());
        }
        if (gate != null) {
            json.add("gate", gate.toJson());
        }
        if (seed != null) {
            json.addProperty("seed", Long.toUnsignedString(seed));
        }
        return GSON.toJson(json);
    }

    private JsonArray inputsJson() {
        if (inputs == null) {
            return null;
        }
        JsonArray array = new JsonArray();
        for (InputSpec input : inputs) {
            array.add(input.toJson());
        }
        return array;
    }

    private static JsonObject spec(String dtype, long[] shape) {
        JsonObject spec = new JsonObject();
        spec.addProperty("dtype", dtype);
        spec.add("shape", GSON.toJsonTree(shape));
        return spec;
    }

    byte[] payload() {
        byte[] json = toJson().getBytes(StandardCharsets.UTF_8);
        byte[] payload = new byte[json.length + 1];
        payload[0] = LogFormat.HEADER;
        System.arraycopy(json, 0, payload, 1, json.length);
        return payload;
    }

    static LogHeader parse(String where, byte[] payload) {
        if (payload.length == 0 || payload[0] != LogFormat.HEADER) {
            throw new LogCorruptException(where + ": not a gradbridge feedback log (the first record is not a header)");
        }
        JsonObject json;
        try {
            json = GSON.fromJson(new String(payload, 1, payload.length - 1, StandardCharsets.UTF_8), JsonObject.class);
        } catch (JsonParseException e) {
            throw new LogCorruptException(where + ": the header record is not valid JSON");
        }
        if (json == null || !LogFormat.FORMAT.equals(string(json, "format"))) {
            throw new LogCorruptException(where + ": not a gradbridge feedback log (format " + json + ")");
        }
        if (!json.has("version") || json.get("version").getAsInt() != LogFormat.FORMAT_VERSION) {
            throw new LogCorruptException(where + ": log format version " + json.get("version") + "; this gradbridge reads "
                    + LogFormat.FORMAT_VERSION);
        }
        try {
            JsonObject x = json.getAsJsonObject("x");
            JsonObject y = json.getAsJsonObject("y");
            LogHeader header = new LogHeader(string(json, "model"), string(json, "model_sha256"),
                    json.get("publish_every").getAsInt(), json.get("max_grad_norm").getAsDouble(),
                    json.get("first_seq").getAsLong(), json.get("seq_floor").getAsLong(), string(x, "dtype"), GSON.fromJson(x.get("shape"), long[].class),
                    string(y, "dtype"), GSON.fromJson(y.get("shape"), long[].class));
            JsonArray inputs = json.getAsJsonArray("inputs");
            if (inputs != null) {
                List<InputSpec> specs = new ArrayList<>();
                for (JsonElement input : inputs) {
                    JsonObject spec = input.getAsJsonObject();
                    specs.add(new InputSpec(string(spec, "name"), string(spec, "dtype"),
                            GSON.fromJson(spec.get("shape"), long[].class)));
                }
                header.withInputs(specs);
            }
            JsonObject gate = json.getAsJsonObject("gate");
            if (gate != null) {
                header.withGate(new GateSettings(string(gate, "data"), string(gate, "data_sha256"),
                        gate.get("max_regression").getAsDouble(), string(gate, "on_hold"), gate.get("keep_versions").getAsInt()));
            }
            if (json.has("seed")) {
                header.withSeed(Long.parseUnsignedLong(json.get("seed").getAsString()));
            }
            return header;
        } catch (RuntimeException e) {
            throw new LogCorruptException(where + ": the header record lacks a field or has one of the wrong type");
        }
    }

    private static String string(JsonObject json, String key) {
        JsonElement value = json.get(key);
        return value == null || value.isJsonNull() ? null : Objects.requireNonNull(value.getAsString());
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof LogHeader && toJson().equals(((LogHeader) other).toJson());
    }

    @Override
    public int hashCode() {
        return toJson().hashCode();
    }

    @Override
    public String toString() {
        return toJson();
    }
}
