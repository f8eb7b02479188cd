package dev.gradbridge.serve;

import dev.gradbridge.GradbridgeException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.UnrecoverableKeyException;
import java.util.Collections;
import org.eclipse.jetty.util.ssl.SslContextFactory;

/**
 * TLS for the main port from a keystore (PKCS12 or JKS, the type read from the file) whose
 * password comes from a file or an environment variable, never the command line (argv is visible
 * to every user of the machine). The keystore is opened and checked when the options are, before
 * anything is created, so a wrong password is one line and nothing is left behind.
 */
final class Tls {

    private final Path keystore;
    private final String password;

    private Tls(Path keystore, String password) {
        this.keystore = keystore;
        this.password = password;
    }

    /**
     * @param keystore the keystore file, or null for plain HTTP
     * @param passwordFile a file holding the password (one line), or null
     * @param passwordEnv an environment variable holding it, or null
     * @return the checked TLS settings, or null without a keystore
     * @throws GradbridgeException naming the option and file when something does not fit
     */
    static Tls open(Path keystore, Path passwordFile, String passwordEnv) throws IOException {
        if (keystore == null) {
            if (passwordFile != null || passwordEnv != null) {
                throw new GradbridgeException("--tls-password-file/--tls-password-env need --tls-keystore");
            }
            return null;
        }
        if (passwordFile != null && passwordEnv != null) {
            throw new GradbridgeException("--tls-password-file and --tls-password-env name two passwords; give one");
        }
        if (passwordFile == null && passwordEnv == null) {
            throw new GradbridgeException("--tls-keystore needs its password from --tls-password-file FILE or"
                    + " --tls-password-env NAME (never on the command line)");
        }
        String password;
        if (passwordFile != null) {
            if (!Files.isRegularFile(passwordFile)) {
                throw new GradbridgeException("no password file at " + passwordFile.toAbsolutePath() + " (--tls-password-file)");
            }
            password = new String(Files.readAllBytes(passwordFile), StandardCharsets.UTF_8).replaceAll("[\\r\\n]+$", "");
        } else {
            password = System.getenv(passwordEnv);
            if (password == null) {
                throw new GradbridgeException("environment variable " + passwordEnv + " is not set (--tls-password-env)");
            }
        }
        if (!Files.isRegularFile(keystore)) {
            throw new GradbridgeException("no keystore at " + keystore.toAbsolutePath() + " (--tls-keystore)");
        }
        KeyStore store;
        try {
            store = KeyStore.getInstance(keystore.toFile(), password.toCharArray());
        } catch (IOException | GeneralSecurityException | IllegalArgumentException e) {
            throw new GradbridgeException("cannot open keystore " + keystore.toAbsolutePath() + " (--tls-keystore): "
                    + reason(e));
        }
        try {
            boolean hasKey = false;
            for (String alias : Collections.list(store.aliases())) {
                if (store.isKeyEntry(alias)) {
                    hasKey = true;
                    try {
                        store.getKey(alias, password.toCharArray()); // Jetty opens the key with the same password
                    } catch (UnrecoverableKeyException e) {
                        throw new GradbridgeException("keystore " + keystore.toAbsolutePath() + ": the key '" + alias
                                + "' has a password other than the keystore's (--tls-keystore needs one password for"
                                + " both: keytool -keypasswd -alias " + alias + ")");
                    }
                }
            }
            if (!hasKey) {
                throw new GradbridgeException("keystore " + keystore.toAbsolutePath() + " holds no private key"
                        + " (--tls-keystore needs the server's key and certificate)");
            }
        } catch (GeneralSecurityException e) {
            throw new GradbridgeException("cannot read keystore " + keystore.toAbsolutePath() + ": " + reason(e));
        }
        return new Tls(keystore.toAbsolutePath(), password);
    }

    /** @return Jetty's server-side TLS settings over the keystore */
    SslContextFactory.Server contextFactory() {
        SslContextFactory.Server factory = new SslContextFactory.Server();
        factory.setKeyStorePath(keystore.toString());
        factory.setKeyStorePassword(password);
        return factory;
    }

    /** The exception's own first line (e.g. "keystore password was incorrect"), without Java class names. */
    private static String reason(Exception e) {
        String message = e.getMessage();
        if (message == null || message.isEmpty()) {
            return "not a keystore, or a wrong password";
        }
        return message.split("\n", 2)[0].replaceAll("\\b(?:[a-z]+\\.)+[A-Z]\\w*(?:Exception|Error): ", "");
    }
}
