package dev.gradbridge.online;

/**
 * An {@link OnlineLearner}'s counters at one moment ({@link OnlineLearner#stats}): immutable, its
 * values read one after another (not under one lock).
 */
public final class LearnerStats {

    private final int queueDepth;
    private final long updates;
    private final long acceptedEvents;
    private final long refusedEvents;
    private final long duplicateEvents;
    private final long refusedSourceRecords;
    private final long quarantinedBatches;
    private final long predictions;
    private final long latestVersion;
    private final long publishedVersions;
    private final long heldVersions;
    private final long rollbacks;
    private final double lastGateLoss;
    private final double servingGateLoss;

    LearnerStats(Assembly parts, long predictions) {
        this.queueDepth = parts.queue.depth();
        this.updates = parts.updater.updates();
        this.acceptedEvents = parts.ingest.accepted.get();
        this.refusedEvents = parts.ingest.refused.get();
        this.duplicateEvents = parts.ingest.duplicates.get();
        this.refusedSourceRecords = parts.ingest.sourceRefused.get();
        this.quarantinedBatches = parts.quarantined.get();
        this.predictions = predictions;
        this.latestVersion = parts.publisher.latest;
        this.publishedVersions = parts.publisher.published.get();
        this.heldVersions = parts.publisher.held.get();
        this.rollbacks = parts.publisher.rollbacks.get();
        this.lastGateLoss = parts.publisher.lastGateLoss;
        this.servingGateLoss = parts.publisher.servingGateLoss;
    }

    /** @return events waiting for training */
    public int getQueueDepth() {
        return queueDepth;
    }

    /** @return micro-batches applied (optimizer steps), including those applied again on resume */
    public long getUpdates() {
        return updates;
    }

    /** @return events this learner accepted since it opened (not counting resumed ones or duplicates) */
    public long getAcceptedEvents() {
        return acceptedEvents;
    }

    /** @return events refused because the queue was full */
    public long getRefusedEvents() {
        return refusedEvents;
    }

    /** @return events answered from an earlier request with the same idempotency key */
    public long getDuplicateEvents() {
        return duplicateEvents;
    }

    /** @return source records refused since this learner opened (not feedback the module takes) */
    public long getRefusedSourceRecords() {
        return refusedSourceRecords;
    }

    /** @return micro-batches quarantined (not applied) since this learner opened */
    public long getQuarantinedBatches() {
        return quarantinedBatches;
    }

    /** @return predictions served */
    public long getPredictions() {
        return predictions;
    }

    /** @return the newest version the learner made and decided on: the serving one, or a newer one the gate held back */
    public long getLatestVersion() {
        return latestVersion;
    }

    /** @return versions published (passed the gate, or every version without one), including those decided again on resume */
    public long getPublishedVersions() {
        return publishedVersions;
    }

    /** @return versions the publish gate held back, including those decided again on resume */
    public long getHeldVersions() {
        return heldVersions;
    }

    /** @return rollbacks ({@link OnlineLearner#rollback}) applied, including those applied again on resume */
    public long getRollbacks() {
        return rollbacks;
    }

    /** @return the gate loss of the last version the gate decided on (NaN: none yet, or no gate) */
    public double getLastGateLoss() {
        return lastGateLoss;
    }

    /** @return the serving version's gate loss (NaN without a publish gate) */
    public double getServingGateLoss() {
        return servingGateLoss;
    }
}
