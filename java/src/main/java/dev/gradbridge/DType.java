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

    /**
     * The one rule for 16-bit inputs in data (Python: {@code protocol.CARRIER}): numpy and Parquet
     * have no bfloat16, so an input of a 16-bit float dtype arrives as float32 values that are
     * exactly its own, cast to it when loaded; a value the cast would round is refused, never rounded.
     *
     * @return the type that carries this one's values in data: float32 for the 16-bit floats, else itself
     */
    public DType carrier() {
        return this == BFLOAT16 || this == FLOAT16 ? FLOAT32 : this;
    }

    /**
     * @param value a float32 value
     * @return whether this 16-bit type holds it exactly (a cast would not round it); true for other types
     */
    public boolean holds(float value) {
        if (this == BFLOAT16) {
            return (Float.floatToRawIntBits(value) & 0xffff) == 0 || Float.isNaN(value);
        }
        if (this == FLOAT16) {
            return Float.isNaN(value) || (Math.abs(value) <= 65504f && widen(half(value)) == value);
        }
        return true;
    }

    /**
     * A 16-bit word widened to float32 exactly.
     *
     * @param word the value's bits (bfloat16 or float16)
     * @return the value
     */
    public float widen(short word) {
        int bits = word & 0xffff;
        if (this == BFLOAT16) {
            return Float.intBitsToFloat(bits << 16);
        }
        if (this != FLOAT16) {
            throw new UnsupportedOperationException(torchName + " is not a 16-bit float");
        }
        int sign = (bits & 0x8000) << 16;
        int exponent = (bits >>> 10) & 0x1f;
        int mantissa = bits & 0x3ff;
        if (exponent == 0x1f) {
            return Float.intBitsToFloat(sign | 0x7f800000 | (mantissa << 13));
        }
        if (exponent == 0) { // zero or subnormal: mantissa * 2^-24
            float magnitude = mantissa * 0x1p-24f;
            return sign == 0 ? magnitude : -magnitude;
        }
        return Float.intBitsToFloat(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
    }

    /**
     * A float32 value rounded to this 16-bit type, to nearest even, as libtorch's conversions round
     * ({@code c10::BFloat16}'s {@code round_to_nearest_even}, {@code c10::Half}'s {@code fp16_ieee_from_fp32_value}).
     *
     * @param value the value
     * @return the rounded value's word
     */
    public short round(float value) {
        int bits = Float.floatToRawIntBits(value);
        if (this == BFLOAT16) {
            return Float.isNaN(value) ? (short) 0x7fc0 : (short) ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16);
        }
        if (this != FLOAT16) {
            throw new UnsupportedOperationException(torchName + " is not a 16-bit float");
        }
        float base = (Math.abs(value) * 0x1.0p+112f) * 0x1.0p-110f;
        int twice = bits + bits;
        int bias = twice & 0xff000000;
        if (Integer.compareUnsigned(bias, 0x71000000) < 0) {
            bias = 0x71000000;
        }
        base = Float.intBitsToFloat((bias >>> 1) + 0x07800000) + base;
        int rounded = Float.floatToRawIntBits(base);
        int nonsign = ((rounded >>> 13) & 0x7c00) + (rounded & 0xfff);
        return (short) (((bits & 0x80000000) >>> 16)
                | (Integer.compareUnsigned(twice, 0xff000000) > 0 ? 0x7e00 : nonsign));
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
