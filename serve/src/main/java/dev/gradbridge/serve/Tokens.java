package dev.gradbridge.serve;

import dev.gradbridge.GradbridgeException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.Set;

/**
 * Where the service's bearer token comes from: a file the operator names, an environment
 * variable, or else a key file generated once in the log folder ({@value #KEY_FILE}, mode 0600,
 * kept across restarts), as TorchServe does by default.
 */
final class Tokens {

    /** The generated key file's name in the log folder. */
    static final String KEY_FILE = "serve.key";

    private Tokens() {}

    /** Reads a token file or variable named by the operator (checked before anything is created). */
    static String named(Path file, String env) throws IOException {
        if (file != null && env != null) {
            throw new GradbridgeException("--token-file and --token-env name two tokens; give one");
        }
        String token;
        String source;
        if (file != null) {
            if (!Files.isRegularFile(file)) {
                throw new GradbridgeException("no token file at " + file.toAbsolutePath() + " (--token-file)");
            }
            token = new String(Files.readAllBytes(file), StandardCharsets.UTF_8).trim();
            source = file.toAbsolutePath().toString();
        } else if (env != null) {
            token = System.getenv(env);
            if (token == null) {
                throw new GradbridgeException("environment variable " + env + " is not set (--token-env)");
            }
            token = token.trim();
            source = "$" + env;
        } else {
            return null;
        }
        if (token.length() < 16 || !token.matches("[\\x21-\\x7e]+")) {
            throw new GradbridgeException("the token in " + source + " must be at least 16 visible ASCII characters");
        }
        return token;
    }

    /** The generated key of {@code logDir}, created (0600, atomically) when missing. */
    static String generated(Path logDir) throws IOException {
        Path file = logDir.resolve(KEY_FILE);
        if (!Files.exists(file)) {
            byte[] random = new byte[32];
            new SecureRandom().nextBytes(random);
            String token = Base64.getUrlEncoder().withoutPadding().encodeToString(random);
            Set<PosixFilePermission> owner = PosixFilePermissions.fromString("rw-------");
            Path tmp = logDir.resolve("." + KEY_FILE + ".tmp");
            Files.deleteIfExists(tmp);
            Files.createFile(tmp, PosixFilePermissions.asFileAttribute(owner));
            Files.setPosixFilePermissions(tmp, owner); // the umask cannot widen it
            Files.write(tmp, (token + "\n").getBytes(StandardCharsets.UTF_8), StandardOpenOption.WRITE);
            try {
                Files.createLink(file, tmp); // never replaces a key another start wrote meanwhile
            } catch (FileAlreadyExistsException raced) {
                // keep the other one
            } finally {
                Files.deleteIfExists(tmp);
            }
        }
        return new String(Files.readAllBytes(file), StandardCharsets.UTF_8).trim();
    }

    /** Compares in constant time. */
    static boolean matches(String expected, String header) {
        if (header == null || !header.startsWith("Bearer ")) {
            return false;
        }
        byte[] given = header.substring("Bearer ".length()).trim().getBytes(StandardCharsets.UTF_8);
        return MessageDigest.isEqual(expected.getBytes(StandardCharsets.UTF_8), given);
    }
}
