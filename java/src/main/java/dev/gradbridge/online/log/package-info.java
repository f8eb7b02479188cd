/**
 * The online learner's write-ahead log, {@value dev.gradbridge.online.log.LogFormat#FILE_NAME}:
 * its framing ({@link dev.gradbridge.online.log.LogFormat}), records ({@link
 * dev.gradbridge.online.log.LogRecord}, {@link dev.gradbridge.online.log.LogHeader}), the strict
 * reader ({@link dev.gradbridge.online.log.LogReader}) and the locked, group-committing writer
 * ({@link dev.gradbridge.online.log.LogWriter}). Python's {@code gradbridge.replay} reads the same
 * format; {@code tests/test_pins.py} ties the two.
 */
package dev.gradbridge.online.log;
