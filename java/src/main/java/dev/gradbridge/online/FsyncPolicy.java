package dev.gradbridge.online;

/** When the write-ahead log forces its writes to the disk. */
public enum FsyncPolicy {
    /**
     * Before {@code learn} returns: an acknowledged event survives a power loss. Concurrent
     * callers share one {@code fsync} (group commit).
     */
    ALWAYS,
    /**
     * Never explicitly: an acknowledged event survives the process being killed (it is in the
     * operating system's page cache) but not a power loss. Much faster on slow disks.
     */
    NEVER;

    /**
     * Parses {@code always} or {@code never} (any case).
     *
     * @param text the policy name
     * @return the policy
     * @throws IllegalArgumentException for any other text
     */
    public static FsyncPolicy parse(String text) {
        for (FsyncPolicy policy : values()) {
            if (policy.name().equalsIgnoreCase(text)) {
                return policy;
            }
        }
        throw new IllegalArgumentException("unknown fsync policy '" + text + "'; expected always or never");
    }
}
