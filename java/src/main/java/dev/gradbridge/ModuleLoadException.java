package dev.gradbridge;

/** A training module file is missing or is not a TorchScript archive that libtorch can load. */
public class ModuleLoadException extends GradbridgeException {

    private static final long serialVersionUID = 1L;

    ModuleLoadException(String message) {
        super(message);
    }

    ModuleLoadException(String message, Throwable cause) {
        super(message, cause);
    }
}
