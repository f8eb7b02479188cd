/**
 * Online learning beside serving: {@link dev.gradbridge.online.OnlineLearner} takes feedback rows
 * ({@link dev.gradbridge.online.HostTensor}), writes them to a write-ahead log before it accepts
 * them, trains on micro-batches on one thread, publishes versions ({@link
 * dev.gradbridge.online.ModelVersion}) to predictors ({@link dev.gradbridge.online.Prediction}),
 * and recovers from its log after a crash. Its other public types are its options ({@link
 * dev.gradbridge.online.OnlineLearnerBuilder}), what its methods take, return or throw, and the
 * log's format ({@link dev.gradbridge.online.LogFormat}, which Python's {@code gradbridge.replay}
 * reads too; {@code tests/test_pins.py} ties the two); the rest of the package, the log's reader
 * and writer included, is package-private.
 */
package dev.gradbridge.online;
