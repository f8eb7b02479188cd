package dev.gradbridge;

/**
 * An error inside libtorch (or gradbridge's native layer), with libtorch's message without its
 * C++ backtrace. gradbridge's calls wrap it in a more specific exception naming the file and
 * method ({@link ModuleLoadException}, {@link MethodCallException}); tensor operations throw it as is.
 */
public class NativeException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    /**
     * Thrown by the native library.
     *
     * @param message libtorch's message
     */
    public NativeException(String message) {
        super(message);
    }
}
