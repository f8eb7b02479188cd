package dev.gradbridge.online;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.FrozenTensors;
import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.Protocol3Messages;
import java.io.IOException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The parts of an {@link OnlineLearner}, wired from its options ({@link OnlineLearnerBuilder}):
 * the module loaded and checked, the log folder locked, read and replayed ({@link Recovery}), the
 * queue, the updater, the publisher, the predictors and the feedback checks ready, and the
 * training loop ({@link MicroBatcher}) built for the learner to start. Everything is read and
 * checked before the first write: a refused start changes nothing and closes what it opened.
 */
final class Assembly {

    final Path logDir;
    final Metadata metadata;
    final Features features;
    final LogWriter log;
    final FeedbackQueue queue;
    final Updater updater;
    final Publisher publisher;
    final PredictorPool predictors;
    final Ingest ingest;
    final Gate gate; // null: every version is published
    final PhaseTimes phases;
    final AtomicLong quarantined = new AtomicLong(); // micro-batches quarantined since the learner opened
    final MicroBatcher batcher;

    private Assembly(Path modelPath, Path logDir, OnlineLearnerBuilder options) throws IOException {
        this.logDir = logDir;
        this.phases = PhaseTimes.of(options.timePhases);
        List<AutoCloseable> opened = new ArrayList<>();
        try {
            TrainingModule original = load(modelPath, options.opLibraries);
            opened.add(original);
            this.metadata = original.getMetadata();
            checkSupported(modelPath, original);
            String modelSha256 = Digests.sha256Hex(modelPath);
            this.features = new Features(metadata);
            Metadata.TensorSpec ySpec = metadata.getInput("y");
            // Sized now, before the log folder is created: a B too large for its buffers is one line.
            ModuleCalls calls = new ModuleCalls(features, ySpec, options.maxBatch, Ingest.rowBytes(ySpec));
            LogHeader wanted = logHeader(metadata, modelSha256, options, features, ySpec).withSeed(options.seed);
            this.gate = openGate(options, original, wanted, opened);

            // Everything is read and checked before the first write: a refused start changes nothing.
            boolean hasLog = Recovery.checkUnlocked(logDir);
            Files.createDirectories(logDir);
            this.log = LogWriter.lock(logDir, options.fsync, !hasLog);
            opened.add(log);
            Recovery recovery = Recovery.read(logDir, log, wanted, modelSha256);
            // The module file's frozen tensors (a LoRA model's base, constant buffers): every module here holds these.
            FrozenTensors frozen = ModuleAccess.frozen(original);
            opened.add(frozen);
            TrainingModule training = resumed(recovery, original, frozen, options.opLibraries, opened);
            this.updater = new Updater(training, frozen, calls, new UpdateGuard(options.maxGradNorm), phases,
                    recovery.runSeed());
            this.predictors = new PredictorPool(modelPath, options.predictors, frozen);
            opened.add(predictors);
            this.queue = new FeedbackQueue(options.queueCapacity, phases);
            this.publisher = new Publisher(logDir, log, queue, updater, modelSha256, options.publishEvery,
                    options.checkpointEvery, phases, gate);
            opened.add(publisher::close);
            List<Path> libraries = options.opLibraries;
            recovery.replay(updater, options.publishEvery, queue, publisher, quarantined,
                    file -> updater.shared(TrainingModule.load(file, libraries)));
            log.startGroupCommit(options.groupCommitMillis, queue::fail);
            this.ingest = new Ingest(features, ySpec, options.queueCapacity, options.validateTargets ? predictors : null,
                    queue, log, queue::fail, phases, options.maxInputAbs);
        } catch (IOException | RuntimeException e) {
            closeAll(opened, e);
            if (e instanceof IOException && !(e instanceof FileSystemException)) {
                throw named(logDir, (IOException) e);
            }
            throw e;
        }
        this.batcher = new MicroBatcher(logDir, log, queue, updater, publisher, options.maxBatch, options.maxWaitMillis,
                quarantined, phases);
    }

    /** The gate, when {@code --gate-data} asks for one (its settings then in the log's header); null otherwise. */
    private static Gate openGate(OnlineLearnerBuilder options, TrainingModule original, LogHeader wanted,
            List<AutoCloseable> opened) {
        if (options.gateData == null) {
            return null;
        }
        Gate gate = Gate.open(options.gateData, options.gateMaxRegression, options.gateOnHold, options.keepVersions,
                original);
        opened.add(gate);
        wanted.withGate(gate.settings());
        return gate;
    }

    /**
     * The module that trains: the log's checkpoint when it has one (sharing the module file's frozen tensors,
     * {@code original} then closed), else {@code original}.
     */
    private static TrainingModule resumed(Recovery recovery, TrainingModule original, FrozenTensors frozen,
            List<Path> opLibraries, List<AutoCloseable> opened) {
        if (recovery.checkpointModule() == null) {
            return original;
        }
        TrainingModule training = TrainingModule.load(recovery.checkpointModule(), opLibraries);
        opened.add(training);
        ModuleAccess.share(training, frozen); // a checkpoint leaves them out (an older one holds a copy: dropped)
        opened.remove(original);
        original.close();
        return training;
    }

    /**
     * @param modelPath the exported training module, absolute
     * @param logDir the log folder, absolute
     * @return the parts of a learner on them, its training loop not started
     */
    static Assembly assemble(Path modelPath, Path logDir, OnlineLearnerBuilder options) throws IOException {
        return new Assembly(modelPath, logDir, options);
    }

    /** Frees the parts once the training thread has stopped, the log first. */
    void close() throws IOException {
        log.close();
        predictors.close();
        publisher.close();
        updater.close();
        if (gate != null) {
            gate.close();
        }
    }

    /** The module, checked whole (every zip entry's checksum) before libtorch reads it. */
    private static TrainingModule load(Path modelPath, List<Path> opLibraries) throws IOException {
        if (Files.isRegularFile(modelPath)) {
            String damage = ModuleArchives.problem(modelPath);
            if (damage != null) {
                throw new InvalidInputException("training module " + modelPath + " " + damage);
            }
        }
        return TrainingModule.load(modelPath, opLibraries);
    }

    /** Closes what a refused start opened, newest first. */
    private static void closeAll(List<AutoCloseable> opened, Exception e) {
        for (int i = opened.size() - 1; i >= 0; i--) {
            try {
                opened.get(i).close();
            } catch (Exception suppressed) {
                e.addSuppressed(suppressed);
            }
        }
    }

    /** A write to the log (e.g. "No space left on device") as an exception that names the file. */
    private static FileSystemException named(Path logDir, IOException e) {
        FileSystemException named = new FileSystemException(LogReader.file(logDir).toString(), null, e.getMessage());
        named.initCause(e);
        return named;
    }

    /**
     * The header a new log gets: per-sample x and y; for a module of several inputs x is the raw
     * bytes of one event (each input's row in metadata order) and {@code inputs} says how they split.
     */
    private static LogHeader logHeader(Metadata metadata, String modelSha256, OnlineLearnerBuilder options,
            Features features, Metadata.TensorSpec ySpec) {
        if (!features.named()) {
            Metadata.TensorSpec xSpec = features.specs().get(0);
            return new LogHeader(metadata.getModel(), modelSha256, options.publishEvery, options.maxGradNorm, 0, 0,
                    xSpec.getDtype(), Ingest.sampleShape(xSpec), ySpec.getDtype(), Ingest.sampleShape(ySpec));
        }
        LogHeader header = new LogHeader(metadata.getModel(), modelSha256, options.publishEvery, options.maxGradNorm, 0, 0,
                LogHeader.NAMED_INPUTS, new long[] {features.rowTotal()}, ySpec.getDtype(), Ingest.sampleShape(ySpec));
        List<LogHeader.InputSpec> inputs = new ArrayList<>();
        for (int i = 0; i < features.names().size(); i++) {
            inputs.add(new LogHeader.InputSpec(features.names().get(i), features.specs().get(i).getDtype(),
                    features.sampleShape(i)));
        }
        return header.withInputs(inputs);
    }

    /**
     * Modules with gradient accumulation are refused, modules whose trained buffers cannot be set on a predictor
     * (exported before {@code set_state}), and protocol-3 modules that cannot run a
     * batch of one (a micro-batch or a prediction may hold one event).
     */
    private static void checkSupported(Path modelPath, TrainingModule module) {
        if (module.getMetadata().getMinBatch() > 1) {
            throw new InvalidInputException(Protocol3Messages.protocol3NoBatchOfOne(modelPath.toString(),
                    module.getMetadata().getMinBatch(), "online learning"));
        }
        if (!module.getMetadata().getTrainedBufferNames().isEmpty() && !module.getMethodNames().contains(Protocol.SET_STATE)) {
            throw new InvalidInputException(modelPath + " has buffers that training changes "
                    + module.getMetadata().getTrainedBufferNames() + " but no method " + Protocol.SET_STATE
                    + " (exported by an older gradbridge): export the model again");
        }
        Object accumulate = module.getMetadata().getFineTuning().get("accumulate");
        if (accumulate instanceof Number && ((Number) accumulate).intValue() > 1) {
            // the metadata's JSON number reads as a Double: said as the integer it is ("2", not "2.0")
            throw new InvalidInputException(Messages.onlineAccumulate(modelPath.toString(),
                    ((Number) accumulate).longValue()));
        }
    }
}
