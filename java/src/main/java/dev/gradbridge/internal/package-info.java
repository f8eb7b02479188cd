/**
 * No API: what the library's own packages, gradbridge-spark, gradbridge-serve and the programs
 * share (error wording, file and digest helpers, a run's start, the calls on a module beyond its
 * user API, the native loaders' settings and cache folder). Public only because Java has no narrower visibility across packages; any of it may
 * change or go without notice. Applications use {@code dev.gradbridge} and its documented packages.
 */
package dev.gradbridge.internal;
