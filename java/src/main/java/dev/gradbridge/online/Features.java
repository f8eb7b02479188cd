package dev.gradbridge.online;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.InputMessages;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;

/**
 * The module's inputs as the learner handles them: {@code x}, or several by name (metadata order).
 * A request's inputs are a map by name ({@code {x: tensor}} for a module of one input); one event
 * (one sample) is the concatenation of each input's row bytes in metadata order, so the log, the
 * queue and the micro-batches hold one byte row per event whatever the inputs.
 */
final class Features {

    private final List<Metadata.TensorSpec> specs;
    private final List<String> names;
    private final int[] rowBytes;
    private final int rowTotal;
    private final boolean named;

    Features(Metadata metadata) {
        this.names = metadata.getInputNames();
        List<Metadata.TensorSpec> list = new ArrayList<>();
        for (String name : names) {
            list.add(metadata.getInput(name));
        }
        this.specs = Collections.unmodifiableList(list);
        this.rowBytes = new int[names.size()];
        int total = 0;
        for (int i = 0; i < rowBytes.length; i++) {
            rowBytes[i] = Ingest.rowBytes(specs.get(i));
            total = Math.addExact(total, rowBytes[i]);
        }
        this.rowTotal = total;
        this.named = metadata.hasNamedInputs();
    }

    /** @return whether the module takes several named inputs (else the one tensor {@code x}) */
    boolean named() {
        return named;
    }

    List<String> names() {
        return names;
    }

    List<Metadata.TensorSpec> specs() {
        return specs;
    }

    /** @return bytes of input {@code i} in one event */
    int rowBytes(int i) {
        return rowBytes[i];
    }

    /** @return bytes of one event's inputs */
    int rowTotal() {
        return rowTotal;
    }

    /** @return how errors name input {@code name}: {@code x}, or {@code x.name} for a module of several inputs */
    String field(String name) {
        return named ? "x." + name : name;
    }

    /**
     * The one tensor of a module of one input, as a map.
     *
     * @throws InvalidInputException for a module of several inputs
     */
    Map<String, HostTensor> single(String method, HostTensor x) {
        if (named) {
            throw new InvalidInputException(InputMessages.namedInputsNeeded(method, names));
        }
        return Collections.singletonMap("x", x);
    }

    /**
     * The inputs in their metadata dtypes: a 16-bit input given as float32 values that are exactly its
     * own cast to it ({@link HostTensor#carriedAs}); the rest as given (checked by {@link #rows}).
     *
     * @throws InvalidInputException naming the first value a 16-bit input does not hold
     */
    Map<String, HostTensor> carried(Map<String, HostTensor> x) {
        Map<String, HostTensor> out = new java.util.LinkedHashMap<>(x);
        for (int i = 0; i < names.size(); i++) {
            HostTensor tensor = x.get(names.get(i));
            if (tensor != null) {
                out.put(names.get(i), tensor.carriedAs(specs.get(i).getDtype(), field(names.get(i))));
            }
        }
        return out;
    }

    /**
     * Checks every input against its spec, no unknown one, and the same number of rows each.
     *
     * @return the rows (samples)
     * @throws InvalidInputException naming the input
     */
    long rows(String method, Map<String, HostTensor> x) {
        for (String name : x.keySet()) {
            if (!names.contains(name)) {
                throw new InvalidInputException(InputMessages.unknownInput(method, name, names));
            }
        }
        long rows = -1;
        for (int i = 0; i < names.size(); i++) {
            HostTensor tensor = x.get(names.get(i));
            if (tensor == null) {
                throw new InvalidInputException(InputMessages.missingInput(method, names.get(i), names));
            }
            long n = Ingest.rows(field(names.get(i)), specs.get(i), tensor);
            if (rows >= 0 && n != rows) {
                throw new InvalidInputException(field(names.get(0)) + " has " + rows + " rows but " + field(names.get(i))
                        + " has " + n);
            }
            rows = n;
        }
        return rows;
    }

    /** @return whether every input's values are finite */
    boolean allFinite(Map<String, HostTensor> x) {
        for (String name : names) {
            if (!x.get(name).allFinite()) {
                return false;
            }
        }
        return true;
    }

    /** @return one byte row per event: each input's row, in metadata order */
    List<byte[]> split(Map<String, HostTensor> x, long rows) {
        List<byte[]> events = new ArrayList<>((int) rows);
        for (int r = 0; r < rows; r++) {
            byte[] event = new byte[rowTotal];
            int at = 0;
            for (int i = 0; i < names.size(); i++) {
                System.arraycopy(x.get(names.get(i)).bytes(), r * rowBytes[i], event, at, rowBytes[i]);
                at += rowBytes[i];
            }
            events.add(event);
        }
        return events;
    }

    /** @return SHA-256 of a request's inputs (metadata order) and targets, as an idempotency key's record holds it */
    byte[] sha256(Map<String, HostTensor> x, HostTensor y) {
        MessageDigest digest = Digests.sha256();
        for (String name : names) {
            digest.update(x.get(name).bytes());
        }
        digest.update(y.bytes());
        return digest.digest();
    }

    /** @return input {@code i}'s per-sample shape (without the batch dimension) */
    long[] sampleShape(int i) {
        long[] shape = specs.get(i).getShape();
        return Arrays.copyOfRange(shape, 1, shape.length);
    }
}
