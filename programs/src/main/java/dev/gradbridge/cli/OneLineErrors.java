package dev.gradbridge.cli;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.GradbridgeException;
import java.io.IOException;
import picocli.CommandLine;

/** The error handling every gradbridge program shares: bad input is one {@code error:} line and exit 1. */
public final class OneLineErrors {

    private OneLineErrors() {}

    /**
     * Makes a bad argument, a {@link GradbridgeException} or an {@link IOException} print one line
     * on stderr and exit 1; anything else still propagates (a bug shows its trace).
     *
     * @param cli the program's command line
     * @return {@code cli}
     */
    public static CommandLine install(CommandLine cli) {
        cli.setParameterExceptionHandler(
                (ex, arguments) -> {
                    ex.getCommandLine().getErr().println(Messages.ERROR_PREFIX + ex.getMessage() + " (see --help)");
                    return 1;
                });
        cli.setExecutionExceptionHandler(
                (ex, commandLine, parseResult) -> {
                    if (ex instanceof GradbridgeException || ex instanceof IOException) {
                        commandLine.getErr().println(Messages.ERROR_PREFIX + ex.getMessage());
                        return 1;
                    }
                    throw ex;
                });
        return cli;
    }
}
