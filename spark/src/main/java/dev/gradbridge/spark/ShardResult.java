package dev.gradbridge.spark;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * What one partition contributes to one step: how many rows of the global mini-batch it held,
 * the mean loss over them, and the gradients of that mean loss (raw little-endian bytes, one buffer
 * per parameter or piece of one) with the flags saying which parameters got one. A task's own result
 * carries no gradients: they are in its exchange's buffers already ({@link GradientExchange#put}).
 */
final class ShardResult {

    final int partition;
    final int rows;
    final double loss;
    final ByteBuffer[] gradients;
    final boolean[] flags;

    ShardResult(int partition, int rows, double loss, ByteBuffer[] gradients, boolean[] flags) {
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
            for (ByteBuffer gradient : gradients) {
                int length = gradient.remaining();
                out.putInt(length).put(out.position(), gradient, gradient.position(), length);
                out.position(out.position() + length);
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
            ByteBuffer[] gradients = new ByteBuffer[in.readInt()];
            for (int i = 0; i < gradients.length; i++) {
                byte[] bytes = new byte[in.readInt()];
                in.readFully(bytes);
                gradients[i] = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
            }
            return new ShardResult(partition, rows, loss, gradients, flags);
        } catch (IOException e) {
            throw new UncheckedIOException("a malformed shard result", e);
        }
    }

    int gradientBytes() {
        int total = 0;
        if (gradients != null) {
            for (ByteBuffer g : gradients) {
                total += g.remaining();
            }
        }
        return total;
    }
}
