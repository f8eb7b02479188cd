package dev.gradbridge;

import dev.gradbridge.internal.PlatformMessages;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Device strings: {@code cpu}, {@code cuda} (= {@code cuda:0}) or {@code cuda:N}, written canonically
 * ({@code cpu}, {@code cuda:N}) once parsed; Python's {@code _runtime.devices} reads them the same way.
 */
final class Devices {

    /** The device a module trains on unless told otherwise. */
    static final String CPU = "cpu";

    private static final Pattern DEVICE = Pattern.compile("cpu|cuda(?::(\\d{1,9}))?");

    private Devices() {}

    /**
     * @param device a device string
     * @return it canonically: {@code cpu} or {@code cuda:N}
     * @throws InvalidInputException when it names no device
     */
    static String canonical(String device) {
        Matcher m = device == null ? null : DEVICE.matcher(device);
        if (m == null || !m.matches()) {
            throw new InvalidInputException(PlatformMessages.unknownDevice(String.valueOf(device)));
        }
        if (CPU.equals(device)) {
            return CPU;
        }
        return "cuda:" + (m.group(1) == null ? 0 : Integer.parseInt(m.group(1)));
    }

    /** @return whether a canonical device is a CUDA device */
    static boolean isCuda(String device) {
        return !CPU.equals(device);
    }

    /** @return a canonical CUDA device's index */
    static int index(String device) {
        return Integer.parseInt(device.substring("cuda:".length()));
    }
}
