package dev.gradbridge.spark;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The buffers and views of a {@link GlooExchange}, sized once per run: {@link #whole} for one
 * all-gather of whole records, {@link #byChunk} for the all-to-all by chunk and its all-gather. The
 * exchange keeps each as a final field of its own (what each one holds is told there); this is read
 * once, by its constructor.
 */
final class GlooLayout {

    private final int partition;
    private final int partitions;
    private final List<String> dtypes;
    private final long[] sizes;
    private final int parameters;
    /** Per parameter: where it starts in the gradient laid end to end, and its bytes. */
    private final long[] offsets;
    private final long[] bytes;
    private final boolean oneDtype;
    /** Per parameter, per piece of it: its index in {@link #send}, its offset in the parameter, its bytes. */
    private final List<List<int[]>> puts = new ArrayList<>();

    final long gradientBytes;
    /** A record's header: rows (int), loss (double), one flag byte per parameter, padded to 8 bytes. */
    final int header;

    int slices;
    long[] recordOffsets;
    long[][] sendSplits;
    ByteBuffer[] sendSlices;
    long[][] receiveSplits;
    ByteBuffer[] receiveSlices;
    ByteBuffer send;
    ByteBuffer gathered;
    long gatherBytes;
    ByteBuffer[] mineCombined;
    ByteBuffer[] gatheredSlices;
    ByteBuffer[] otherCombined;
    long[] pairSplits;
    int[] slicePieces;
    ByteBuffer headers;
    long headerStride;
    GradientCombiner combiner;
    GradientCombiner.Combined combined;
    Chunks chunks;
    ByteBuffer[][] gatheredPieces;
    long[] alltoalls;
    long[] allgathers;

    /** Each parameter's place and bytes in the gradient laid end to end (a dtype that is not floating: refused). */
    GlooLayout(int partition, int partitions, List<String> dtypes, long[] sizes) {
        this.partition = partition;
        this.partitions = partitions;
        this.dtypes = dtypes;
        this.sizes = sizes;
        parameters = sizes.length;
        offsets = new long[parameters];
        bytes = new long[parameters];
        long total = 0;
        boolean same = true;
        for (int i = 0; i < parameters; i++) {
            GradientCombiner.requireFloating(dtypes.get(i));
            offsets[i] = total;
            bytes[i] = sizes[i] * ShardedData.bytesOf(dtypes.get(i));
            total += bytes[i];
            same &= dtypes.get(i).equals(dtypes.get(0));
        }
        gradientBytes = total;
        oneDtype = same;
        header = (4 + 8 + parameters + 7) / 8 * 8;
        for (int i = 0; i < parameters; i++) {
            puts.add(new ArrayList<>());
        }
    }

    /** One all-gather of every task's whole record; every task combines all K into a buffer of its own. */
    void whole() {
        long record = header + gradientBytes;
        recordOffsets = new long[] {0};
        slices = 1;
        send = Buffers.direct(record);
        gatherBytes = record;
        gathered = Buffers.direct(record * partitions);
        headers = gathered;
        headerStride = record;
        for (int i = 0; i < parameters; i++) {
            puts.get(i).add(new int[] {Math.toIntExact(header + offsets[i]), 0, Math.toIntExact(bytes[i])});
        }
        ByteBuffer[][] inputs = new ByteBuffer[partitions][];
        for (int q = 0; q < partitions; q++) {
            inputs[q] = new ByteBuffer[parameters];
            for (int i = 0; i < parameters; i++) {
                inputs[q][i] = Buffers.view(gathered, record * q + header + offsets[i], bytes[i]);
            }
        }
        ByteBuffer out = Buffers.direct(gradientBytes);
        ByteBuffer[] outputs = new ByteBuffer[parameters];
        int[] identity = new int[parameters];
        for (int i = 0; i < parameters; i++) {
            outputs[i] = Buffers.view(out, offsets[i], bytes[i]);
            identity[i] = i;
        }
        combiner = new GradientCombiner(dtypes, identity, inputs, outputs);
        combined = new GradientCombiner.Combined(outputs, new boolean[parameters]);
    }

    /** K·S chunks: S all-to-alls of a record per owner, each owner's combined chunk all-gathered, padded to the longest. */
    void byChunk(int slices) {
        this.slices = slices;
        int n = partitions * slices;
        chunks = new Chunks(dtypes, sizes, n);
        long longest = 0;
        for (int i = 0; i < n; i++) {
            longest = Math.max(longest, chunks.bytes(i));
        }
        long[] sendStarts = new long[slices + 1];
        long[] receiveStarts = new long[slices + 1];
        splitRecords(sendStarts, receiveStarts);
        send = Buffers.direct(sendStarts[slices]);
        ByteBuffer receive = Buffers.direct(receiveStarts[slices]);
        gatherBytes = longest;
        gathered = Buffers.direct(longest * n);
        sliceViews(receive, sendStarts, receiveStarts);
        headers = receiveSlices[0];
        headerStride = receiveSplits[0][0];
        combiner = sliceCombiner(receive, receiveStarts);
        combinedGradient(n);
        alltoalls = new long[slices];
        allgathers = new long[slices];
    }

    /**
     * Slice s: to each owner c a record of chunk s·K + c, slice 0's with the header first; the records'
     * sizes, where each slice starts in the send and receive buffers, and where each gradient piece goes.
     */
    private void splitRecords(long[] sendStarts, long[] receiveStarts) {
        recordOffsets = new long[partitions];
        sendSplits = new long[slices][partitions];
        receiveSplits = new long[slices][partitions];
        for (int s = 0; s < slices; s++) {
            long head = s == 0 ? header : 0;
            for (int c = 0; c < partitions; c++) {
                int chunk = s * partitions + c;
                if (s == 0) {
                    recordOffsets[c] = sumTo(sendSplits[0], c);
                }
                sendSplits[s][c] = head + chunks.bytes(chunk);
                long within = 0;
                for (Chunks.Piece piece : chunks.pieces(chunk)) {
                    puts.get(piece.parameter).add(new int[] {Math.toIntExact(
                            sendStarts[s] + sumTo(sendSplits[s], c) + head + within),
                        chunks.offset(piece), chunks.bytes(piece)});
                    within += chunks.bytes(piece);
                }
            }
            Arrays.fill(receiveSplits[s], head + chunks.bytes(s * partitions + partition));
            sendStarts[s + 1] = sendStarts[s] + sumTo(sendSplits[s], partitions);
            receiveStarts[s + 1] = receiveStarts[s] + receiveSplits[s][0] * partitions;
        }
    }

    /** Per slice: its part of the send and receive buffers, my slot of the all-gather and its output. */
    private void sliceViews(ByteBuffer receive, long[] sendStarts, long[] receiveStarts) {
        long longest = gatherBytes;
        sendSlices = new ByteBuffer[slices];
        receiveSlices = new ByteBuffer[slices];
        mineCombined = new ByteBuffer[slices];
        gatheredSlices = new ByteBuffer[slices];
        otherCombined = partitions == 2 ? new ByteBuffer[slices] : null;
        pairSplits = partitions == 2 ? new long[2] : null;
        if (pairSplits != null) {
            pairSplits[1 - partition] = longest;
        }
        for (int s = 0; s < slices; s++) {
            int chunk = s * partitions + partition;
            sendSlices[s] = Buffers.view(send, sendStarts[s], sendStarts[s + 1] - sendStarts[s]);
            receiveSlices[s] = Buffers.view(receive, receiveStarts[s], receiveStarts[s + 1] - receiveStarts[s]);
            mineCombined[s] = Buffers.view(gathered, longest * chunk, longest);
            gatheredSlices[s] = Buffers.view(gathered, longest * partitions * s, longest * partitions);
            if (otherCombined != null) {
                otherCombined[s] = Buffers.view(gathered, longest * (s * 2 + 1 - partition), longest);
            }
        }
    }

    /** The combine of my chunks: each piece's K records read in place, written into my slot of the all-gather. */
    private GradientCombiner sliceCombiner(ByteBuffer receive, long[] receiveStarts) {
        long longest = gatherBytes;
        slicePieces = new int[slices + 1];
        List<String> pieceDtypes = new ArrayList<>();
        List<Integer> pieceParameters = new ArrayList<>();
        List<ByteBuffer> outs = new ArrayList<>();
        List<List<ByteBuffer>> pieceInputs = new ArrayList<>();
        for (int q = 0; q < partitions; q++) {
            pieceInputs.add(new ArrayList<>());
        }
        for (int s = 0; s < slices; s++) {
            int chunk = s * partitions + partition;
            long record = receiveSplits[s][0];
            long head = s == 0 ? header : 0;
            long within = 0;
            for (Chunks.Piece piece : chunks.pieces(chunk)) {
                int length = chunks.bytes(piece);
                for (int q = 0; q < partitions; q++) {
                    pieceInputs.get(q).add(
                            Buffers.view(receive, receiveStarts[s] + record * q + head + within, length));
                }
                outs.add(Buffers.view(gathered, longest * chunk + within, length));
                pieceDtypes.add(dtypes.get(piece.parameter));
                pieceParameters.add(piece.parameter);
                within += length;
            }
            slicePieces[s + 1] = outs.size();
        }
        ByteBuffer[][] inputs = new ByteBuffer[partitions][];
        for (int q = 0; q < partitions; q++) {
            inputs[q] = pieceInputs.get(q).toArray(new ByteBuffer[0]);
        }
        return new GradientCombiner(pieceDtypes, pieceParameters.stream().mapToInt(Integer::intValue).toArray(),
                inputs, outs.toArray(new ByteBuffer[0]));
    }

    /**
     * Where the optimizer reads the combined gradient: the all-gather's output in place when it is the
     * gradient laid end to end, else a buffer per parameter that the gathered pieces are pasted into.
     */
    private void combinedGradient(int n) {
        long longest = gatherBytes;
        // one dtype: every chunk followed by a non-empty one is full, so the padded chunks are the gradient
        boolean flat = oneDtype;
        for (int i = 0; i + 1 < n; i++) {
            flat &= chunks.bytes(i + 1) == 0 || chunks.bytes(i) == longest;
        }
        ByteBuffer[] gradients = new ByteBuffer[parameters];
        for (int i = 0; i < parameters; i++) {
            gradients[i] = flat ? Buffers.view(gathered, offsets[i], bytes[i]) : Buffers.direct(bytes[i]);
        }
        combined = new GradientCombiner.Combined(gradients, new boolean[parameters]);
        gatheredPieces = flat ? null : new ByteBuffer[n][];
        for (int c = 0; !flat && c < n; c++) {
            List<Chunks.Piece> pieces = chunks.pieces(c);
            gatheredPieces[c] = new ByteBuffer[pieces.size()];
            long at = 0;
            for (int j = 0; j < pieces.size(); j++) {
                gatheredPieces[c][j] = Buffers.view(gathered, longest * c + at, chunks.bytes(pieces.get(j)));
                at += chunks.bytes(pieces.get(j));
            }
        }
    }

    /**
     * @param field 0: each piece's index in the send buffer, 1: its offset in the parameter, 2: its bytes
     * @return per parameter, per piece of it, that field (after {@link #whole} or {@link #byChunk})
     */
    int[][] puts(int field) {
        int[][] table = new int[parameters][];
        for (int i = 0; i < parameters; i++) {
            List<int[]> at = puts.get(i);
            table[i] = new int[at.size()];
            for (int j = 0; j < at.size(); j++) {
                table[i][j] = at.get(j)[field];
            }
        }
        return table;
    }

    /** @return the sum of {@code values[0..to)} */
    private static long sumTo(long[] values, int to) {
        long sum = 0;
        for (int i = 0; i < to; i++) {
            sum += values[i];
        }
        return sum;
    }
}
