package dev.gradbridge;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Locale;

/**
 * The element types gradbridge moves between Java, numpy and libtorch: the one definition of
 * their names (torch's spelling, as {@code gradbridge.json} writes them), sizes, numpy
 * descriptors and libtorch codes. Values are in the platform's byte order inside tensors and
 * little-endian in files ({@code .npy}, the feedback log, checkpoints' JSON has no bytes).
 */
public enum DType {
    UINT8("uint8", 1, 0, "|u1"),
    INT8("int8", 1, 1, "|i1"),
    INT16("int16", 2, 2, "<i2"),
    INT32("int32", 4, 3, "<i4"),
    INT64("int64", 8, 4, "<i8"),
    FLOAT16("float16", 2, 5, "<f2"),
    FLOAT32("float32", 4, 6, "<f4"),
    FLOAT64("float64", 8, 7, "<f8"),
    BOOL("bool", 1, 11, "|b1"),
    BFLOAT16("bfloat16", 2, 15, null);

    /** The byte order of values in files: numpy's {@code <} descriptors and the feedback log. */
    public static final ByteOrder FILE_ORDER = ByteOrder.LITTLE_ENDIAN;

    private static final DType[] BY_CODE = new DType[16];

    static {
        for (DType type : values()) {
            BY_CODE[type.code] = type;
        }
    }

    private final String torchName;
    private final int size;
    private final int code;
    private final String numpyDescr;

    DType(String torchName, int size, int code, String numpyDescr) {
        this.torchName = torchName;
        this.size = size;
        this.code = code;
        this.numpyDescr = numpyDescr;
    }

    /** @return torch's name, e.g. {@code float32} (what {@code gradbridge.json} and HostTensor use) */
    public String torchName() {
        return torchName;
    }

    /** @return bytes per element */
    public int size() {
        return size;
    }

    /** @return whether values are floating point (NaN and infinities possible) */
    public boolean isFloating() {
        return this == FLOAT16 || this == FLOAT32 || this == FLOAT64 || this == BFLOAT16;
    }

    /** @return numpy's little-endian descriptor, e.g. {@code <f4}; null where numpy has none */
    public String numpyDescr() {
        return numpyDescr;
    }

    /** libtorch's {@code c10::ScalarType} code (fixed across libtorch versions). */
    int code() {
        return code;
    }

    /**
     * Writes one value in this type's bytes, in the buffer's byte order: what digests hash and
     * files hold. Values arrive as exact doubles (float32 and integer values widened).
     *
     * @param out where the bytes go
     * @param value the value (for float16 and bfloat16 one of theirs, widened exactly)
     */
    public void put(ByteBuffer out, double value) {
        switch (this) {
            case BFLOAT16: out.putShort((short) (Float.floatToRawIntBits((float) value) >>> 16)); break;
            case FLOAT16: out.putShort(half((float) value)); break;
            case FLOAT32: out.putFloat((float) value); break;
            case FLOAT64: out.putDouble(value); break;
            case INT64: out.putLong((long) value); break;
            case INT32: out.putInt((int) value); break;
            case INT16: out.putShort((short) value); break;
            case INT8: case UINT8: case BOOL: out.put((byte) (long) value); break;
            default: throw new UnsupportedOperationException("no Java value type for " + torchName);
        }
    }

    /** IEEE half-precision bits of a float that one holds exactly (a float16 value widened). */
    static short half(float value) {
        int bits = Float.floatToRawIntBits(value);
        int sign = (bits >>> 16) & 0x8000;
        int exponent = (bits >>> 23) & 0xff;
        int mantissa = bits & 0x7fffff;
        if (exponent == 0xff) { // infinity, NaN (its payload's top bits, one kept set)
            return (short) (sign | 0x7c00 | (mantissa == 0 ? 0 : 0x200 | (mantissa >>> 13)));
        }
        int e = exponent - 127 + 15;
        if (e >= 1) { // normal
            return (short) (sign | (e << 10) | (mantissa >>> 13));
        }
        if (exponent == 0) {
            return (short) sign; // zero (a float16 value is never a float32 subnormal)
        }
        return (short) (sign | ((mantissa | 0x800000) >>> (14 - e))); // subnormal
    }

    /**
     * The type of a torch name.
     *
     * @param name e.g. {@code float32}
     * @return the type
     * @throws InvalidInputException for a name that is none of these
     */
    public static DType of(String name) {
        for (DType type : values()) {
            if (type.torchName.equals(name)) {
                return type;
            }
        }
        throw new InvalidInputException("dtype " + name + " is not supported; expected one of " + names());
    }

    /**
     * The type of a numpy descriptor in the platform's or little-endian byte order ({@code <f4},
     * {@code =f4}, {@code |b1}, {@code f4}).
     *
     * @param descr numpy's descriptor
     * @return the type, or null when gradbridge has none for it
     */
    public static DType ofNumpy(String descr) {
        String bare = descr.replaceFirst("^[<=|]", "");
        for (DType type : values()) {
            if (type.numpyDescr != null && type.numpyDescr.substring(1).equals(bare)) {
                return type;
            }
        }
        return null;
    }

    /** The type of a libtorch code; null for types gradbridge does not move (complex, quantized). */
    static DType ofCode(int code) {
        return code >= 0 && code < BY_CODE.length ? BY_CODE[code] : null;
    }

    private static String names() {
        StringBuilder out = new StringBuilder();
        for (DType type : values()) {
            out.append(out.length() == 0 ? "" : ", ").append(type.torchName);
        }
        return out.toString();
    }

    @Override
    public String toString() {
        return torchName.toLowerCase(Locale.ROOT);
    }
}
