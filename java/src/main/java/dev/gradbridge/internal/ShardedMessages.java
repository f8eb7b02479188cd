package dev.gradbridge.internal;


/**
 * The wording of the lines about data-parallel training and gradbridge-spark: modules that cannot
 * train data-parallel, Spark's line, master, driver and settings (python:
 * {@code messages/sharded.py}, the same sentences where both sides print them).
 */
public final class ShardedMessages {

    private ShardedMessages() {}

    // ---- data-parallel training (gradbridge-spark, reference shards) ----

    /**
     * @param module the training module file
     * @param version its protocol version
     * @param missing the data-parallel methods it lacks
     * @return the line for a module that cannot train data-parallel
     */
    public static String dataParallelMethods(String module, int version, java.util.List<String> missing) {
        return module + ": protocol " + version + " module without " + String.join(", ", missing)
                + ", which data-parallel training needs (protocol 2); re-export it with this gradbridge version";
    }

    /**
     * @param module the training module file
     * @param buffers the buffers its training step writes
     * @return the line for a module whose training writes buffers, exported before {@code set_state}
     */
    public static String dataParallelBuffers(String module, java.util.List<String> buffers) {
        return module + ": training writes its buffers " + buffers + " (e.g. BatchNorm statistics), and it has no"
                + " method set_state, which data-parallel training needs to keep them equal across partitions;"
                + " re-export it with this gradbridge version";
    }



    /**
     * @param module the training module file
     * @param accumulate its gradient-accumulation factor
     * @return the line for a module exported with gradient accumulation
     */
    public static String dataParallelAccumulate(String module, long accumulate) {
        return module + ": exported with accumulate=" + accumulate + "; data-parallel training splits each"
                + " mini-batch over partitions instead: export it with accumulate=1";
    }


    /**
     * @param scala the Scala version of the gradbridge-spark artifact that runs
     * @param built the Spark versions that artifact is built for
     * @param spark the Spark version that runs
     * @param sparkScala the Scala version that runs
     * @return the line for a gradbridge-spark artifact on a Spark of another line
     */
    public static String sparkLine(String scala, String built, String spark, String sparkScala) {
        return "gradbridge-spark_" + scala + " is built for Spark " + built + " (Scala " + scala + "), this is Spark "
                + spark + " on Scala " + sparkScala + "; use gradbridge-spark_2.12 (spark-submit:"
                + " gradbridge-spark-submit_2.12) for Spark 3.5.x on Scala 2.12, gradbridge-spark_2.13"
                + " (gradbridge-spark-submit_2.13) for Spark 4.0 to 4.3";
    }

    /**
     * @param source where the master came from ({@code --master} or {@code spark.master})
     * @param master the master URL
     * @return the line for a master URL Spark cannot run on
     */
    public static String sparkMaster(String source, String master) {
        return source + " " + master + ": not a Spark master URL; expected local, local[K], local[K,F] (K at"
                + " least 1 or *), local-cluster[N,C,M], spark://HOST:PORT, or one a cluster manager on the"
                + " classpath accepts (yarn, k8s://URL)";
    }

    /**
     * @param key the setting ({@code spark.driver.host} or {@code spark.driver.bindAddress})
     * @param host its value
     * @param reason why the driver cannot listen there
     * @return the line for a driver address that is not this machine's
     */
    public static String sparkDriverAddress(String key, String host, String reason) {
        return key + " " + host + ": the driver cannot listen there (" + reason + "); name an address of this"
                + " machine, or leave it unset";
    }


    /**
     * @param reason Spark's own message, first line
     * @return the line for a Spark context that failed to start
     */
    public static String sparkStart(String reason) {
        return "Spark could not start: " + reason;
    }

    /**
     * @param setting the exchange setting
     * @param allowed the values it takes
     * @param value the value given
     * @return the line for an exchange that does not exist
     */
    public static String sparkExchange(String setting, java.util.List<String> allowed, String value) {
        return setting + " must be " + String.join(" or ", allowed) + ", got " + value;
    }

    /**
     * @param setting the one-round bytes setting
     * @param most its largest value
     * @param value the value given
     * @return the line for a byte count out of range
     */
    public static String sparkOneRoundBytes(String setting, long most, String value) {
        return setting + " must be a whole number of bytes in 0.." + most + ", got " + value;
    }

    /**
     * @param setting the threads-per-task setting
     * @param most its largest value
     * @param value the value given
     * @return the line for a thread count out of range
     */
    public static String sparkThreads(String setting, int most, String value) {
        return setting + " must be a whole number of threads in 1.." + most + ", got " + value;
    }
}
