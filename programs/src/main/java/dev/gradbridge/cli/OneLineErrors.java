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
     * on stderr and exit 1, and so an {@link OutOfMemoryError} in any thread (the line names what to
     * change: {@link Messages#outOfMemory}); anything else still propagates (a bug shows its trace).
     *
     * @param cli the program's command line
     * @return {@code cli}
     */
    public static CommandLine install(CommandLine cli) {
        String program = cli.getCommandName();
        Thread.UncaughtExceptionHandler previous = Thread.getDefaultUncaughtExceptionHandler();
        Thread.setDefaultUncaughtExceptionHandler((thread, e) -> {
            if (e instanceof OutOfMemoryError) {
                // the stack has unwound (its memory is free again), so the line can be built and printed
                System.err.println(Messages.ERROR_PREFIX + Messages.outOfMemory(e.getMessage(), program));
                System.err.flush();
                Runtime.getRuntime().halt(1); // the run is over; its files were written atomically or not at all
            } else if (previous != null) {
                previous.uncaughtException(thread, e);
            } else { // what the JVM prints (ThreadGroup's would call this handler again)
                System.err.print("Exception in thread \"" + thread.getName() + "\" ");
                e.printStackTrace(System.err);
            }
        });
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
