package dev.gradbridge.spark;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

/**
 * The gradient cut into K chunks over the parameters laid end to end in protocol order: with E
 * elements in all and {@code L = ceil(E/K)}, chunk c holds elements {@code [min(E, L*c), min(E,
 * L*(c+1)))}, as pieces (a parameter and an element range of it). Every chunk but the last has L
 * elements, so when every parameter has one dtype the chunks laid end to end, each padded to the
 * longest, are the whole gradient laid end to end (the Gloo exchange's all-gather output is then the
 * combined gradient itself, no copy out). The combine is element by element, so combining each
 * chunk's pieces apart gives the same bits as combining whole parameters, wherever the cuts fall.
 */
final class Chunks {

    /** Part of one parameter: elements [start, start + length). */
    static final class Piece {
        final int parameter;
        final int start;
        final int length;

        Piece(int parameter, int start, int length) {
            this.parameter = parameter;
            this.start = start;
            this.length = length;
        }
    }

    private final List<List<Piece>> chunks = new ArrayList<>();
    private final int[] elementBytes;

    Chunks(List<String> dtypes, long[] sizes, int k) {
        elementBytes = new int[sizes.length];
        long total = 0;
        for (int i = 0; i < sizes.length; i++) {
            elementBytes[i] = ShardedData.bytesOf(dtypes.get(i));
            total += sizes[i];
        }
        long each = (total + k - 1) / k;
        for (int c = 0; c < k; c++) {
            long from = Math.min(total, each * c);
            long to = Math.min(total, each * (c + 1));
            List<Piece> pieces = new ArrayList<>();
            long offset = 0;
            for (int i = 0; i < sizes.length; i++) {
                long start = Math.max(from, offset);
                long end = Math.min(to, offset + sizes[i]);
                if (start < end) {
                    pieces.add(new Piece(i, (int) (start - offset), (int) (end - start)));
                }
                offset += sizes[i];
            }
            chunks.add(pieces);
        }
    }

    int count() {
        return chunks.size();
    }

    List<Piece> pieces(int chunk) {
        return chunks.get(chunk);
    }

    /** @return the piece's offset in its parameter's bytes */
    int offset(Piece piece) {
        return piece.start * elementBytes[piece.parameter];
    }

    /** @return the piece's length in bytes */
    int bytes(Piece piece) {
        return piece.length * elementBytes[piece.parameter];
    }

    /** @return the bytes of {@code chunk}'s pieces together */
    long bytes(int chunk) {
        long out = 0;
        for (Piece piece : pieces(chunk)) {
            out += bytes(piece);
        }
        return out;
    }

    /** @return views of the pieces of {@code chunk} in whole-parameter gradients (no copy) */
    ByteBuffer[] cut(int chunk, ByteBuffer[] gradients) {
        List<Piece> pieces = pieces(chunk);
        ByteBuffer[] out = new ByteBuffer[pieces.size()];
        for (int j = 0; j < out.length; j++) {
            Piece piece = pieces.get(j);
            out[j] = Buffers.view(gradients[piece.parameter], offset(piece), bytes(piece));
        }
        return out;
    }

    /** Copies the pieces of {@code chunk} into whole-parameter gradients. */
    void paste(int chunk, ByteBuffer[] pieceBytes, ByteBuffer[] gradients) {
        List<Piece> pieces = pieces(chunk);
        for (int j = 0; j < pieceBytes.length; j++) {
            Piece piece = pieces.get(j);
            gradients[piece.parameter].put(offset(piece), pieceBytes[j], 0, bytes(piece));
        }
    }

    /** @return per piece of {@code chunk}: its parameter's dtype */
    List<String> dtypes(int chunk, List<String> dtypes) {
        List<String> out = new ArrayList<>();
        for (Piece piece : pieces(chunk)) {
            out.add(dtypes.get(piece.parameter));
        }
        return out;
    }

    /** @return per piece of {@code chunk}: its parameter's index */
    int[] parameters(int chunk) {
        List<Piece> pieces = pieces(chunk);
        int[] out = new int[pieces.size()];
        for (int j = 0; j < out.length; j++) {
            out[j] = pieces.get(j).parameter;
        }
        return out;
    }
}
