package dev.gradbridge;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertTrue;

import java.util.Locale;
import org.junit.Test;

/** Loading a module tunes glibc's allocator once, unless the environment does. */
public class NativeMemoryTest {

    @Test
    public void loadingAModuleAppliesTheSettingsOnce() {
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("mlp_classifier.pt"))) {
            String state = NativeMemory.describe();
            assertSame(state, NativeMemory.tune());
            boolean linux = System.getProperty("os.name", "").toLowerCase(Locale.ROOT).contains("linux");
            boolean environment = System.getenv("MALLOC_MMAP_THRESHOLD_") != null
                    || System.getenv("MALLOC_TRIM_THRESHOLD_") != null || System.getenv("MALLOC_TOP_PAD_") != null
                    || String.valueOf(System.getenv("GLIBC_TUNABLES")).contains("malloc");
            if (linux && !environment && System.getProperty(NativeMemory.PROPERTY) == null) {
                assertEquals(NativeMemory.SETTINGS, state); // this project's machines: Linux with glibc
            } else {
                assertTrue(state, !state.equals("not applied yet"));
            }
        }
    }
}
