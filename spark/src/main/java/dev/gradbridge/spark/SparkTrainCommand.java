package dev.gradbridge.spark;

import dev.gradbridge.internal.AtomicFiles;
import dev.gradbridge.internal.RunStart;
import dev.gradbridge.History;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Locale;
import java.util.concurrent.Callable;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import dev.gradbridge.cli.OneLineErrors;
import dev.gradbridge.cli.RunOptions;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

/**
 * {@code gradle sparkTrain} / {@code spark-submit}: synchronous data-parallel training of an
 * exported module on Spark ({@link SparkTrainer}). Every input is checked before the first step;
 * bad input ends the program with exit code 1 and one {@code error:} line, and writes nothing.
 */
@Command(
        name = "gradbridge-spark-train",
        mixinStandardHelpOptions = true,
        description = "Data-parallel training of an exported gradbridge module on Apache Spark.")
public final class SparkTrainCommand implements Callable<Integer> {

    @Mixin
    private RunOptions run;

    @Option(names = "--data", required = true,
            description = "training data: Parquet (file, folder or Hadoop URI such as hdfs://...; columns x and y,"
                    + " or one per input of a model of several inputs and y) or a local .npz (arrays named so)")
    private String data;

    @Option(names = "--master",
            description = "Spark master, e.g. local[2] (default: spark-submit's --master, else local[2]); "
                    + "local[K,F] lets a failed task be retried F-1 times")
    private String master;

    @Option(names = "--partitions",
            description = "partitions (shards) of the data (default: Spark's default parallelism)")
    private Integer partitions;

    @Option(names = "--shuffle", negatable = true,
            description = "shuffle each epoch (default, or the checkpoint's); --no-shuffle takes rows in order")
    private Boolean shuffle;

    @Option(names = "--stats", description = "write the run's counters and timings here (JSON)")
    private Path stats;

    @Option(names = "--inject-fault", hidden = true, description = "test only: task@E:S:P or executor@E:S:P")
    private String fault;

    @Override
    public Integer call() throws IOException {
        Path modelFile = run.module();
        // a data-parallel run's checkpoint names its data by shards_sha256 (older ones: data_sha256)
        run.checkResume("shards_sha256", RunStart.DATA_SHA256);
        boolean npz = data.toLowerCase(Locale.ROOT).endsWith(".npz");
        boolean uri = data.matches("[A-Za-z][A-Za-z0-9+.-]*://.*");
        if ((npz || !uri) && !Files.exists(Paths.get(data))) {
            throw new InvalidInputException(data + ": no such file or folder");
        }
        SparkTrainer.Builder builder =
                run.apply(SparkTrainer.builder()).optFault(fault).optEpochListener(SparkTrainCommand::printEpoch);
        if (shuffle != null) {
            builder.optShuffle(shuffle);
        }
        SparkTrainer trainer = builder.build();
        if (stats != null) {
            AtomicFiles.prepare(stats);
        }
        SparkConf conf = new SparkConf().setAppName("gradbridge-spark-train");
        QuietLogging.driver(conf);
        String source = master != null ? "--master" : "spark.master";
        if (master != null) {
            conf.setMaster(master);
        } else if (!conf.contains("spark.master")) {
            conf.setMaster("local[2]");
        }
        conf.setIfMissing("spark.ui.enabled", "false");
        // The settings and the module first: each refused before Spark starts (which takes seconds).
        SparkSettings.check(conf, source);
        try (TrainingModule module = TrainingModule.load(modelFile)) {
            SparkTrainer.checkModule(module);
            SparkSession spark = QuietLogging.start(() -> SparkSession.builder().config(conf).getOrCreate());
            try {
                JavaSparkContext jsc = JavaSparkContext.fromSparkContext(spark.sparkContext());
                int k = partitions != null ? partitions : jsc.defaultParallelism();
                ShardedData shards = npz
                        ? ShardedData.fromNpz(jsc, Paths.get(data), k, module.getMetadata())
                        : ShardedData.fromParquet(spark, data, k, module.getMetadata());
                History result;
                try {
                    result = trainer.fit(jsc, module, shards);
                } finally {
                    shards.unpersist();
                }
                SparkStats counters = trainer.getStats();
                System.out.println(String.format(Locale.ROOT,
                        "spark: %d partitions, %d steps, %d barrier stage(s) retried",
                        counters.partitions, counters.steps, counters.stagesRetried));
                if (stats != null) {
                    AtomicFiles.write(stats, (counters.toJson() + "\n").getBytes(StandardCharsets.UTF_8));
                }
                run.printOutputs(result);
            } finally {
                spark.stop();
            }
        }
        return 0;
    }

    private static void printEpoch(History.EpochRecord record) {
        System.out.printf(Locale.ROOT, "epoch %d: loss %.6g%n", record.getEpoch(), record.getLoss());
        System.out.flush();
    }

    /**
     * Runs the command; exit code 0 on success, 1 with one line on stderr on bad input.
     *
     * @param args see {@code --help}
     */
    public static void main(String[] args) {
        System.exit(execute(args));
    }

    static int execute(String... args) {
        CommandLine cli = OneLineErrors.install(new CommandLine(new SparkTrainCommand()));
        return cli.execute(args);
    }
}
