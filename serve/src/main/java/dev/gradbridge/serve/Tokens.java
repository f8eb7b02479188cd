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
import java.util.EnumSet;
import java.util.Set;

/**
 * Where the service's bearer token comes from: a file the operator names, an environment
 * variable, or else a key file generated once in the log folder ({@value #KEY_FILE}, mode 0600,
 * kept across restarts), as TorchServe does by default.
 *
 * <p>A token is {@value #MIN_LENGTH} to {@value #MAX_LENGTH} visible ASCII characters (a longer one
 * would not fit in Jetty's request header limit, so every request would be refused); a token file
 * (named or generated) that others may read is used with a warning.
 */
final class Tokens {

    /** The generated key file's name in the log folder. */
    static final String KEY_FILE = "serve.key";
    /** Shortest token. */
    static final int MIN_LENGTH = 16;
    /** Longest token: an {@code Authorization} header well inside Jetty's 8 KiB of request headers. */
    static final int MAX_LENGTH = 1024;

    private static final String SCHEME = "Bearer ";
    private static final Set<PosixFilePermission> OTHERS = EnumSet.complementOf(
            EnumSet.of(PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE));

    private Tokens() {}

    /**
     * Reads a token file or variable named by the operator (checked before anything is created).
     *
     * @return the token, or null when neither is given
     */
    static String named(Path file, String env) throws IOException {
        if (file != null && env != null) {
            throw new GradbridgeException("--token-file and --token-env name two tokens; give one");
        }
        if (file != null) {
            if (!Files.isRegularFile(file)) {
                throw new GradbridgeException("no token file at " + file.toAbsolutePath() + " (--token-file)");
            }
            return read(file.toAbsolutePath(), "--token-file");
        }
        if (env != null) {
            String token = System.getenv(env);
            if (token == null) {
                throw new GradbridgeException("environment variable " + env + " is not set (--token-env)");
            }
            return check(token.trim(), "$" + env + " (--token-env)");
        }
        return null;
    }

    /**
     * The generated key of a log folder that exists, checked like a named token file before anything
     * is created; null when the folder has none yet.
     */
    static String existingKey(Path logDir) throws IOException {
        Path file = logDir.resolve(KEY_FILE).toAbsolutePath();
        if (!Files.exists(file)) {
            return null;
        }
        if (!Files.isRegularFile(file)) {
            throw new GradbridgeException(file + " is not a file; remove it and a new key is generated");
        }
        return read(file, "delete it to generate a new key");
    }

    /** The generated key of {@code logDir}, created (0600, atomically) when missing. */
    static String generated(Path logDir) throws IOException {
        Path file = logDir.resolve(KEY_FILE).toAbsolutePath();
        if (!Files.exists(file)) {
            byte[] random = new byte[32];
            new SecureRandom().nextBytes(random);
            String token = Base64.getUrlEncoder().withoutPadding().encodeToString(random);
            Set<PosixFilePermission> owner = PosixFilePermissions.fromString("rw-------");
            Path tmp = logDir.resolve("." + KEY_FILE + ".tmp");
            try {
                Files.deleteIfExists(tmp);
                Files.createFile(tmp, PosixFilePermissions.asFileAttribute(owner));
                Files.setPosixFilePermissions(tmp, owner); // the umask cannot widen it
                Files.write(tmp, (token + "\n").getBytes(StandardCharsets.UTF_8), StandardOpenOption.WRITE);
                try {
                    Files.createLink(file, tmp); // never replaces a key another start wrote meanwhile
                } catch (FileAlreadyExistsException raced) {
                    // keep the other one
                }
            } catch (IOException e) {
                throw new IOException("cannot write the key file " + file + ": " + reason(e), e);
            } finally {
                Files.deleteIfExists(tmp);
            }
        }
        return read(file, "delete it to generate a new key");
    }

    /** Reads and checks a token file; a file others may read gets a warning line. */
    private static String read(Path file, String hint) throws IOException {
        String token = new String(Files.readAllBytes(file), StandardCharsets.UTF_8).trim();
        check(token, file + " (" + hint + ")");
        try {
            Set<PosixFilePermission> mode = Files.getPosixFilePermissions(file);
            if (mode.stream().anyMatch(OTHERS::contains)) {
                System.err.println("gradbridge-serve: warning: token file " + file + " has mode "
                        + PosixFilePermissions.toString(mode) + ": others may read or change it; chmod 600 " + file);
            }
        } catch (UnsupportedOperationException notPosix) {
            // no POSIX modes on this file system: nothing to say
        }
        return token;
    }

    private static String check(String token, String source) {
        if (token.isEmpty()) {
            throw new GradbridgeException("the token in " + source + " is empty; it must be " + MIN_LENGTH + " to "
                    + MAX_LENGTH + " visible ASCII characters");
        }
        if (token.length() < MIN_LENGTH || token.length() > MAX_LENGTH || !token.matches("[\\x21-\\x7e]+")) {
            throw new GradbridgeException("the token in " + source + " must be " + MIN_LENGTH + " to " + MAX_LENGTH
                    + " visible ASCII characters, got " + token.length() + " characters"
                    + (token.matches("[\\x21-\\x7e]*") ? "" : " with spaces, control or non-ASCII characters"));
        }
        return token;
    }

    /** The reason of an I/O error without the file name Java puts first. */
    static String reason(IOException e) {
        if (e instanceof java.nio.file.FileSystemException) {
            String reason = ((java.nio.file.FileSystemException) e).getReason();
            if (reason != null) {
                return reason;
            }
        }
        return String.valueOf(e.getMessage());
    }

    /**
     * Compares in constant time; the scheme is case-insensitive (RFC 7235: {@code bearer TOKEN}
     * is {@code Bearer TOKEN}).
     */
    static boolean matches(String expected, String header) {
        if (header == null || !header.regionMatches(true, 0, SCHEME, 0, SCHEME.length())) {
            return false;
        }
        byte[] given = header.substring(SCHEME.length()).trim().getBytes(StandardCharsets.UTF_8);
        return MessageDigest.isEqual(expected.getBytes(StandardCharsets.UTF_8), given);
    }
}
