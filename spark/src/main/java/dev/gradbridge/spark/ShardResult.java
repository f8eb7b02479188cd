package dev.gradbridge.spark;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;

/**
 * What one partition contributes to one step: how many rows of the global mini-batch it held,
 * the mean loss over them, and the gradients of that mean loss (raw little-endian bytes, one array
 * per parameter in {@code parameter_names()} order) with the flags saying which parameters got one.
 */
final class ShardResult {

    final int partition;
    final int rows;
    final double loss;
    final byte[][] gradients;
    final boolean[] flags;

    ShardResult(int partition, int rows, double loss, byte[][] gradients, boolean[] flags) {
        this.partition = partition;
        this.rows = rows;
        this.loss = loss;
        this.gradients = gradients;
        this.flags = flags;
    }

    static ShardResult empty(int partition) {
        return new ShardResult(partition, 0, 0.0, null, null);
    }

    /**
     * @return partition, rows, loss, then (rows > 0) the flags and the gradient arrays (each count
     *     first: an exchange may send the flags of every parameter with the gradients of a few)
     */
    byte[] encode() {
        // One exact-size array, written in place: no growing buffer and no copy out of it.
        int size = 16;
        if (rows > 0) {
            size += 4 + flags.length + 4 + 4 * gradients.length + gradientBytes();
        }
        ByteBuffer out = ByteBuffer.allocate(size); // big-endian, as DataInputStream reads it
        out.putInt(partition).putInt(rows).putDouble(loss);
        if (rows > 0) {
            out.putInt(flags.length);
            for (boolean flag : flags) {
                out.put((byte) (flag ? 1 : 0));
            }
            out.putInt(gradients.length);
            for (byte[] gradient : gradients) {
                out.putInt(gradient.length).put(gradient);
            }
        }
        return out.array();
    }

    static ShardResult decode(byte[] encoded) {
        try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(encoded))) {
            int partition = in.readInt();
            int rows = in.readInt();
            double loss = in.readDouble();
            if (rows == 0) {
                return new ShardResult(partition, 0, loss, null, null);
            }
            boolean[] flags = new boolean[in.readInt()];
            for (int i = 0; i < flags.length; i++) {
                flags[i] = in.readBoolean();
            }
            byte[][] gradients = new byte[in.readInt()][];
            for (int i = 0; i < gradients.length; i++) {
                gradients[i] = new byte[in.readInt()];
                in.readFully(gradients[i]);
            }
            return new ShardResult(partition, rows, loss, gradients, flags);
        } catch (IOException e) {
            throw new UncheckedIOException("a malformed shard result", e);
        }
    }

    int gradientBytes() {
        int total = 0;
        if (gradients != null) {
            for (byte[] g : gradients) {
                total += g.length;
            }
        }
        return total;
    }
}
