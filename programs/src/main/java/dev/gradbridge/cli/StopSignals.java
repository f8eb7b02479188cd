package dev.gradbridge.cli;

import dev.gradbridge.Trainer;
import sun.misc.Signal;

/**
 * SIGTERM and SIGINT for the command-line trainer: the first asks the run to stop after the epoch
 * in progress (its checkpoint and history written), the second stops at once (the checkpoint is
 * never torn: it is replaced by a rename; a temp file left behind is removed by the next run).
 * Only the CLI installs these: a JVM inside Python must leave the host's signals alone.
 */
final class StopSignals {

    private static volatile String received;
    private static volatile int number;

    private StopSignals() {}

    static void install(Trainer trainer) {
        for (String name : new String[] {"TERM", "INT"}) {
            try {
                Signal.handle(new Signal(name), signal -> {
                    if (received != null) {
                        Runtime.getRuntime().halt(128 + signal.getNumber());
                    }
                    received = "SIG" + signal.getName();
                    number = signal.getNumber();
                    trainer.requestStop();
                });
            } catch (IllegalArgumentException | UnsupportedOperationException e) {
                // No such signal here (or the JVM reserves it): keep the default behaviour.
            }
        }
    }

    /** @return the signal's name, e.g. {@code SIGTERM} */
    static String received() {
        return received;
    }

    /** @return the shell's convention for a run ended by the signal: 128 + its number */
    static int exitCode() {
        return 128 + number;
    }
}
