package dev.gradbridge.data;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.internal.Messages;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The header of one {@code .npy} array, checked before its data is read: a big-endian array
 * would train on byte-swapped values, a Fortran-ordered one on scrambled rows, and a crafted
 * shape would overflow; each is refused here with one line.
 */
final class NpyHeader {

    /** numpy's element descriptor, e.g. {@code <f4}. */
    final String descr;
    /** The array's shape. */
    final long[] shape;

    private NpyHeader(String descr, long[] shape) {
        this.descr = descr;
        this.shape = shape;
    }

    private static final byte[] MAGIC = {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y'};
    private static final Pattern DESCR = Pattern.compile("'descr'\\s*:\\s*'([^']*)'");
    private static final Pattern FORTRAN = Pattern.compile("'fortran_order'\\s*:\\s*(True|False)");
    private static final Pattern SHAPE = Pattern.compile("'shape'\\s*:\\s*\\(([^)]*)\\)");
    private static final Pattern ITEM_SIZE = Pattern.compile("^[<>|=]?[a-zA-Z](\\d+)$");


    /**
     * Reads the header from {@code in} and checks it against the bytes that follow it.
     *
     * @param in positioned at the start of the array; left at the start of the data
     * @param totalBytes the size of the whole .npy (header and data)
     * @param source the file, for messages
     * @param array the array's name, for messages
     * @return the header
     * @throws InvalidInputException when the array cannot be read as it is meant
     */
    static NpyHeader check(InputStream in, long totalBytes, String source, String array) throws IOException {
        DataInputStream data = new DataInputStream(in);
        byte[] magic = new byte[MAGIC.length + 2];
        data.readFully(magic);
        for (int i = 0; i < MAGIC.length; i++) {
            if (magic[i] != MAGIC[i]) {
                throw new InvalidInputException(Messages.npyHeader(source, array, "the magic string is missing"));
            }
        }
        int major = magic[MAGIC.length];
        long length;
        int prefix;
        if (major == 1) {
            length = (data.readUnsignedByte()) | (data.readUnsignedByte() << 8);
            prefix = MAGIC.length + 4;
        } else if (major == 2 || major == 3) {
            length = 0;
            for (int i = 0; i < 4; i++) {
                length |= ((long) data.readUnsignedByte()) << (8 * i);
            }
            prefix = MAGIC.length + 6;
        } else {
            throw new InvalidInputException(Messages.npyHeader(source, array, "unknown format version " + major));
        }
        if (length > totalBytes) {
            throw new InvalidInputException(
                    Messages.npyHeader(source, array, "header length " + length + " exceeds the file"));
        }
        byte[] text = new byte[(int) length];
        data.readFully(text);
        String header = new String(text, StandardCharsets.ISO_8859_1);
        Matcher descr = DESCR.matcher(header);
        Matcher fortran = FORTRAN.matcher(header);
        Matcher shape = SHAPE.matcher(header);
        if (!descr.find() || !fortran.find() || !shape.find()) {
            throw new InvalidInputException(
                    Messages.npyHeader(source, array, "expected descr, fortran_order and shape, got " + header.trim()));
        }
        String dtype = descr.group(1);
        long itemSize = itemSize(dtype);
        if (dtype.startsWith(">") && itemSize > 1) {
            throw new InvalidInputException(Messages.bigEndian(source, array, dtype));
        }
        if ("True".equals(fortran.group(1))) {
            throw new InvalidInputException(Messages.fortranOrder(source, array));
        }
        long[] dims = parseShape(shape.group(1), source, array);
        long claimed = claimedBytes(itemSize, dims);
        long available = totalBytes - prefix - length;
        if (itemSize > 0 && claimed != available) {
            throw new InvalidInputException(Messages.npySize(source, array, dims, dtype, claimed, available));
        }
        return new NpyHeader(dtype, dims);
    }

    /** Bytes the shape's elements take, or -1 when that overflows 64 bits. */
    private static long claimedBytes(long itemSize, long[] dims) {
        long claimed = itemSize;
        for (long dim : dims) {
            try {
                claimed = Math.multiplyExact(claimed, dim);
            } catch (ArithmeticException e) {
                return -1;
            }
        }
        return claimed;
    }

    /** Bytes per element from a descriptor such as {@code <f4}; 0 when it names no size. */
    private static long itemSize(String descr) {
        Matcher size = ITEM_SIZE.matcher(descr);
        return size.find() ? Long.parseLong(size.group(1)) : 0;
    }

    private static long[] parseShape(String text, String source, String array) {
        String[] parts = text.split(",");
        int count = 0;
        long[] dims = new long[parts.length];
        for (String part : parts) {
            String trimmed = part.trim();
            if (trimmed.isEmpty()) {
                continue;
            }
            try {
                dims[count] = Long.parseLong(trimmed.endsWith("L") ? trimmed.substring(0, trimmed.length() - 1) : trimmed);
            } catch (NumberFormatException e) {
                throw new InvalidInputException(Messages.npyHeader(source, array, "shape (" + text + ") is not numbers"));
            }
            if (dims[count] < 0) {
                throw new InvalidInputException(Messages.npyHeader(source, array, "negative dimension in (" + text + ")"));
            }
            count++;
        }
        long[] shape = new long[count];
        System.arraycopy(dims, 0, shape, 0, count);
        return shape;
    }
}
