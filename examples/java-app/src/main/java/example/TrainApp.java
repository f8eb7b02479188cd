package example;

import dev.gradbridge.History;
import dev.gradbridge.Tensor;
import dev.gradbridge.Trainer;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;

/** Trains an exported gradbridge module on an .npz file and writes the per-epoch history. */
public final class TrainApp {

    private TrainApp() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: TrainApp MODEL.pt DATA.npz EPOCHS HISTORY.jsonl");
            System.exit(2);
        }
        Path model = Paths.get(args[0]);
        Path data = Paths.get(args[1]);
        int epochs = Integer.parseInt(args[2]);
        Path historyFile = Paths.get(args[3]);

        Trainer trainer = Trainer.builder().optEpochs(epochs).optBatchSize(16).optSeed(1)
                .optMode(Trainer.Mode.STEP).build();
        try (TrainingModule module = TrainingModule.load(model);
                Dataset train = Dataset.loadNpz(data)) {
            History history = trainer.fit(module, train);
            history.save(historyFile);
            History.EpochRecord last = history.getRecords().get(history.getRecords().size() - 1);
            try (Tensor predictions = module.forward(train.getX())) { // gradbridge's own tensor type
                System.out.printf("trained %d epochs, final loss %.6f, predictions %s%n",
                        epochs, last.getLoss(), Arrays.toString(predictions.shape()));
            }
        }
    }
}
