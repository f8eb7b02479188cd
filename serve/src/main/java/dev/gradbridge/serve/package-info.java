/**
 * gradbridge-serve, the online service: {@link dev.gradbridge.serve.ServeCommand} ({@code
 * gradbridge-serve}) runs an {@code OnlineLearner} behind an HTTP API ({@link
 * dev.gradbridge.serve.HttpApi}, JSON tensors in {@link dev.gradbridge.serve.JsonTensors}), with
 * optional TLS, bearer tokens and Kafka feedback. A program, not a library: its classes are no API.
 */
package dev.gradbridge.serve;
