package dev.gradbridge.internal;

import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.MethodCallException;
import dev.gradbridge.Tensor;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Which array of the data holds an id or label the model cannot take (a class label 7 for 3
 * classes, an embedding id at or past its rows), found by asking the model: libtorch's own error
 * ("Target 7 is out of bounds", "index out of range in self") names neither the data nor the array.
 *
 * <p>Each int64 array is summarised by the smallest and largest value of each element of a row
 * over all rows ({@link Column}). {@link #check} evaluates the module (eval mode, no gradients,
 * parameters untouched) on two rows of zeros (the inputs' float values too); when it takes those,
 * it evaluates rows holding one array's largest values, then its smallest, array by array in the
 * module's order (the inputs, then y); the first refused names the array, its element (bisection
 * over the row's elements) and the value, and the range the model takes there (the values around
 * 0 it takes, searched one element at a time). A value the model takes alone but not beside the
 * other elements' extremes (no row need hold them together) gives no line. Python's {@code data.out_of_range} is the same
 * search, so both languages print the same line ({@link InputMessages#valueOutOfRange}).
 *
 * <p>The single-process trainers run it when a step or a validation loss fails (nothing to pay
 * otherwise); gradbridge-spark runs it on the driver before its barrier stage, where a failing
 * task would fail the stage again at every retry.
 */
public final class ValueRanges {

    private ValueRanges() {}

    /** One array of the data: its name, dtype, a row's shape, and (int64) each element's extremes. */
    public static final class Column implements Serializable {
        private static final long serialVersionUID = 1L;
        final String name;
        final DType dtype;
        final long[] rowShape;
        /** Per element of a row (int64 arrays only, else null): the smallest and largest value over the rows. */
        final long[] min;
        final long[] max;

        private Column(String name, DType dtype, long[] rowShape, long[] min, long[] max) {
            this.name = name;
            this.dtype = dtype;
            this.rowShape = rowShape;
            this.min = min;
            this.max = max;
        }

        /**
         * @param name the array's name (an input of the module, or y)
         * @param array its rows, batch dimension first
         * @return the array's summary
         */
        public static Column of(String name, Tensor array) {
            long[] shape = array.shape();
            long[] rowShape = Arrays.copyOfRange(shape, 1, shape.length);
            if (array.dtype() != DType.INT64) {
                return new Column(name, array.dtype(), rowShape, null, null);
            }
            return ofLongs(name, rowShape, array.buffer().asLongBuffer(), shape[0]);
        }

        /**
         * @param name the array's name
         * @param dtype its dtype
         * @param rowShape one row's shape
         * @param rows {@code count} rows' bytes, little-endian (a Spark shard's column)
         * @param count the rows
         * @return the array's summary
         */
        public static Column of(String name, DType dtype, long[] rowShape, byte[] rows, long count) {
            if (dtype != DType.INT64) {
                return new Column(name, dtype, rowShape.clone(), null, null);
            }
            return ofLongs(name, rowShape.clone(), ByteBuffer.wrap(rows).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer(),
                    count);
        }

        private static Column ofLongs(String name, long[] rowShape, LongBuffer values, long count) {
            if (count == 0) { // no values to search (a Spark partition is never empty; a checked Dataset neither)
                return new Column(name, DType.INT64, rowShape, null, null);
            }
            int per = Math.toIntExact(elements(rowShape));
            long[] min = new long[per];
            long[] max = new long[per];
            Arrays.fill(min, Long.MAX_VALUE);
            Arrays.fill(max, Long.MIN_VALUE);
            int at = 0;
            for (long r = 0; r < count; r++) {
                for (int e = 0; e < per; e++) {
                    long value = values.get(at++);
                    min[e] = Math.min(min[e], value);
                    max[e] = Math.max(max[e], value);
                }
            }
            return new Column(name, DType.INT64, rowShape, min, max);
        }

        /**
         * @param other the same array's summary over other rows
         * @return the summary over both
         */
        public Column merge(Column other) {
            if (other.min == null) {
                return this;
            }
            if (min == null) {
                return other;
            }
            long[] low = min.clone();
            long[] high = max.clone();
            for (int e = 0; e < low.length; e++) {
                low[e] = Math.min(low[e], other.min[e]);
                high[e] = Math.max(high[e], other.max[e]);
            }
            return new Column(name, dtype, rowShape, low, high);
        }
    }

    /**
     * @param data checked data ({@link Dataset#check}: the module's inputs in its order)
     * @return its arrays' summaries: the inputs, then y
     */
    public static List<Column> columns(Dataset data) {
        List<Column> columns = new ArrayList<>();
        for (Map.Entry<String, Tensor> input : data.getInputs().entrySet()) {
            columns.add(Column.of(input.getKey(), input.getValue()));
        }
        columns.add(Column.of("y", data.getY()));
        return columns;
    }

    /**
     * The exception to throw for {@code failure}, a training step or loss that failed on {@code data}:
     * the data's line when an array holds a value the model does not take, else {@code failure}.
     *
     * @param module the module that failed
     * @param data the data it failed on
     * @param failure libtorch's error
     * @return the exception to throw
     */
    public static RuntimeException blame(TrainingModule module, Dataset data, MethodCallException failure) {
        String line = check(module, data.getSource(), columns(data));
        return line == null ? failure : new InvalidInputException(line);
    }

    /**
     * @param module the module
     * @param source the data, for the line
     * @param columns its arrays: the module's inputs in its order, then y
     * @return the line naming an array that holds a value the module does not take, or null (none
     *     found, or the module does not take rows of zeros either, or an element's extreme is refused only
     *     beside the other elements')
     */
    public static String check(TrainingModule module, String source, List<Column> columns) {
        Probe probe = new Probe(module, columns);
        if (probe.fails(-1, null)) {
            return null;
        }
        for (int c = 0; c < columns.size(); c++) {
            Column column = columns.get(c);
            if (column.min == null) {
                continue;
            }
            for (long[] extreme : new long[][] {column.max, column.min}) {
                String line = probe.fails(c, extreme) ? locate(probe, source, c, extreme) : null;
                if (line != null) {
                    return line;
                }
            }
        }
        return null;
    }

    /**
     * The element of column {@code c} at fault, by bisection; its value; the range the model takes
     * there. Null when that element's value alone is taken.
     */
    private static String locate(Probe probe, String source, int c, long[] extreme) {
        Column column = probe.columns.get(c);
        List<Integer> candidates = new ArrayList<>();
        for (int e = 0; e < extreme.length; e++) {
            if (extreme[e] != 0) {
                candidates.add(e);
            }
        }
        while (candidates.size() > 1) {
            List<Integer> half = candidates.subList(0, candidates.size() / 2);
            candidates = new ArrayList<>(probe.fails(c, only(extreme, half)) ? half
                    : candidates.subList(candidates.size() / 2, candidates.size()));
        }
        int e = candidates.get(0);
        long value = extreme[e];
        long[] element = column.rowShape.length == 0 || elements(column.rowShape) == 1 ? null
                : unravel(e, column.rowShape);
        if (!probe.fails(c, at(extreme.length, e, value))) {
            // refused only beside other elements' extremes, which no row may hold together: no line (gradbridge-spark
            // must not refuse data it cannot show to be wrong; a failed step keeps libtorch's own error)
            return null;
        }
        int length = extreme.length;
        long low = edge(probe, c, length, e, value < 0 ? value : far(probe, c, length, e, -1));
        long high = edge(probe, c, length, e, value > 0 ? value : far(probe, c, length, e, 1));
        return InputMessages.valueOutOfRange(source, column.name, element, value, low, high);
    }

    /** The farthest a range is searched from 0 on the side away from the value at fault. */
    private static final long FAR = 1L << 62;

    /**
     * A value the module refuses at element {@code e} on the side {@code direction} of 0, found by
     * doubling (1, 2, 4, ... up to {@link #FAR}); {@code direction * FAR} when it takes all of those.
     */
    private static long far(Probe probe, int c, int length, int e, int direction) {
        for (int bit = 0; bit < 62; bit++) {
            long value = direction * (1L << bit);
            if (probe.fails(c, at(length, e, value))) {
                return value;
            }
        }
        return direction * FAR;
    }

    /**
     * The last value the module takes at element {@code e} from 0 towards {@code refused}, by binary
     * search ({@code refused} itself when the module takes it: the end of the search).
     */
    private static long edge(Probe probe, int c, int length, int e, long refused) {
        if (!probe.fails(c, at(length, e, refused))) {
            return refused;
        }
        long ok = 0;
        long bad = refused;
        while (bad - ok > 1 || bad - ok < -1) { // no overflow: ok lies between 0 and bad
            long mid = ok + (bad - ok) / 2;
            if (probe.fails(c, at(length, e, mid))) {
                bad = mid;
            } else {
                ok = mid;
            }
        }
        return ok;
    }

    private static long[] only(long[] extreme, List<Integer> elements) {
        long[] row = new long[extreme.length];
        for (int e : elements) {
            row[e] = extreme[e];
        }
        return row;
    }

    private static long[] at(int length, int e, long value) {
        long[] row = new long[length];
        row[e] = value;
        return row;
    }

    static long elements(long[] shape) {
        long count = 1;
        for (long dim : shape) {
            count *= dim;
        }
        return count;
    }

    private static long[] unravel(long index, long[] shape) {
        long[] out = new long[shape.length];
        for (int d = shape.length - 1; d >= 0; d--) {
            out[d] = index % shape[d];
            index /= shape[d];
        }
        return out;
    }

    /** Evaluates the module on two rows of zeros, one int64 array's row replaced. */
    private static final class Probe {
        private static final int ROWS = 2;
        final TrainingModule module;
        final List<Column> columns;

        Probe(TrainingModule module, List<Column> columns) {
            this.module = module;
            this.columns = columns;
        }

        /** @return whether the module refuses the rows with column {@code c}'s row set to {@code row} (c < 0: zeros) */
        boolean fails(int c, long[] row) {
            List<Tensor> made = new ArrayList<>();
            try {
                Map<String, Tensor> x = new LinkedHashMap<>();
                Tensor y = null;
                for (int i = 0; i < columns.size(); i++) {
                    Column column = columns.get(i);
                    Tensor tensor = rows(column, i == c ? row : null);
                    made.add(tensor);
                    if (i == columns.size() - 1) {
                        y = tensor;
                    } else {
                        x.put(column.name, tensor);
                    }
                }
                module.evaluate(x, y);
                return false;
            } catch (MethodCallException e) {
                return true;
            } finally {
                for (Tensor tensor : made) {
                    tensor.close();
                }
            }
        }

        private static Tensor rows(Column column, long[] row) {
            long[] shape = new long[column.rowShape.length + 1];
            shape[0] = ROWS;
            System.arraycopy(column.rowShape, 0, shape, 1, column.rowShape.length);
            int per = Math.toIntExact(elements(column.rowShape));
            switch (column.dtype) {
                case INT64: {
                    long[] values = new long[ROWS * per];
                    if (row != null) {
                        for (int r = 0; r < ROWS; r++) {
                            System.arraycopy(row, 0, values, r * per, per);
                        }
                    }
                    return Tensor.of(values, shape);
                }
                default: // zeros of the column's floating dtype (a 16-bit input's too)
                    return Tensor.ofDoubles(column.dtype, new double[ROWS * per], shape);
            }
        }
    }
}
