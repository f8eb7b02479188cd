/** Timing loops that run inside the JVM, so that benchmarks measure Java, not the caller. */
package dev.gradbridge.bench;
