package dev.gradbridge.spark;

import java.util.ArrayList;
import java.util.List;

/**
 * The gradient cut into K chunks of about equal element counts, over the parameters laid end to
 * end in protocol order: chunk c holds elements [E*c/K, E*(c+1)/K) of the E in all, as pieces
 * (a parameter and an element range of it). The combine is element by element, so combining
 * each chunk's pieces apart gives the same bits as combining whole parameters.
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
        for (int c = 0; c < k; c++) {
            long from = total * c / k;
            long to = total * (c + 1) / k;
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

    /** @return the bytes of each piece of {@code chunk}, cut from whole-parameter gradients */
    byte[][] cut(int chunk, byte[][] gradients) {
        List<Piece> pieces = pieces(chunk);
        byte[][] out = new byte[pieces.size()][];
        for (int j = 0; j < out.length; j++) {
            Piece piece = pieces.get(j);
            out[j] = new byte[bytes(piece)];
            System.arraycopy(gradients[piece.parameter], offset(piece), out[j], 0, out[j].length);
        }
        return out;
    }

    /** Copies the pieces of {@code chunk} into whole-parameter gradients. */
    void paste(int chunk, byte[][] pieceBytes, byte[][] gradients) {
        List<Piece> pieces = pieces(chunk);
        for (int j = 0; j < pieceBytes.length; j++) {
            Piece piece = pieces.get(j);
            System.arraycopy(pieceBytes[j], 0, gradients[piece.parameter], offset(piece), pieceBytes[j].length);
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

    /** @return per piece of {@code chunk}: its element count */
    long[] sizes(int chunk) {
        List<Piece> pieces = pieces(chunk);
        long[] out = new long[pieces.size()];
        for (int j = 0; j < out.length; j++) {
            out[j] = pieces.get(j).length;
        }
        return out;
    }

    /** @return per piece of {@code chunk}: its parameter's flag */
    boolean[] flags(int chunk, boolean[] flags) {
        List<Piece> pieces = pieces(chunk);
        boolean[] out = new boolean[pieces.size()];
        for (int j = 0; j < out.length; j++) {
            out[j] = flags[pieces.get(j).parameter];
        }
        return out;
    }
}
