/**
 * The online learner's write-ahead log, {@value dev.gradbridge.online.log.LogFormat#FILE_NAME}:
 * its framing ({@link dev.gradbridge.online.log.LogFormat}), records ({@link
 * dev.gradbridge.online.log.LogRecord}, {@link dev.gradbridge.online.log.LogHeader}), the strict
 * reader ({@link dev.gradbridge.online.log.LogReader}) and the locked, group-committing writer
 * ({@link dev.gradbridge.online.log.LogWriter}). Python's {@code gradbridge.replay} reads the same
 * format; {@code tests/test_pins.py} ties the two.
 *
 * <p>API: {@link dev.gradbridge.online.log.FsyncPolicy} (an {@code OnlineLearner} option), {@link
 * dev.gradbridge.online.log.LogCorruptException} (what opening a damaged log throws) and {@link
 * dev.gradbridge.online.log.LogFormat} (the format's constants). The reader, writer, header and
 * records are public only for {@code dev.gradbridge.online}: no API, they may change without notice.
 */
package dev.gradbridge.online.log;
