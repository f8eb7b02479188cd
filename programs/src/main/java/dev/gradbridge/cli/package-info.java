/** Command-line entry points: {@link dev.gradbridge.cli.TrainCommand} ({@code gradbridge-train}). */
package dev.gradbridge.cli;
