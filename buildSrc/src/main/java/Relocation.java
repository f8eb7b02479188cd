import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Enumeration;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;

/**
 * Moves a library's classes to a package of gradbridge's own inside a jar for spark-submit, as a
 * shading plugin's relocation does: Spark loads its own jars before the application's, and Spark
 * 3.5 ships gson 2.2.4 (gradbridge needs 2.8+), so without it gradbridge would run on Spark's gson.
 *
 * <p>It rewrites names in the class files' constant pools only (class names, descriptors, signatures
 * and string constants are all CONSTANT_Utf8 entries; nothing else in a class file names a class),
 * so it reads any class-file version; the shading plugins' ASM does not know Java 17's on the
 * Gradle 4.4.1 they would need. Resources under the moved package move with it.
 */
public final class Relocation {

    private Relocation() {}

    /**
     * Unpacks {@code jar} (a jar or a classes folder) into {@code out}, with {@code from} (a package
     * prefix in internal form, {@code com/google/gson/}) moved to {@code to}, in names and in classes.
     * Manifests and signatures are left out.
     */
    public static void unpack(File jar, File out, String from, String to) throws IOException {
        if (jar.isDirectory()) {
            Path root = jar.toPath();
            try (java.util.stream.Stream<Path> files = Files.walk(root)) {
                for (Path file : (Iterable<Path>) files.filter(Files::isRegularFile)::iterator) {
                    String name = root.relativize(file).toString().replace(File.separatorChar, '/');
                    write(out, name, Files.readAllBytes(file), from, to);
                }
            } catch (UncheckedIOException e) {
                throw e.getCause();
            }
            return;
        }
        try (ZipFile zip = new ZipFile(jar)) {
            Enumeration<? extends ZipEntry> entries = zip.entries();
            while (entries.hasMoreElements()) {
                ZipEntry entry = entries.nextElement();
                if (entry.isDirectory()) {
                    continue;
                }
                try (InputStream in = zip.getInputStream(entry)) {
                    write(out, entry.getName(), readAll(in), from, to);
                }
            }
        }
    }

    private static void write(File out, String name, byte[] bytes, String from, String to) throws IOException {
        String upper = name.toUpperCase(java.util.Locale.ROOT);
        if (upper.equals("META-INF/MANIFEST.MF") || upper.matches("META-INF/[^/]+\\.(SF|DSA|RSA)")
                || name.endsWith("module-info.class")) {
            return;
        }
        byte[] content = name.endsWith(".class") ? relocate(bytes, from, to) : bytes;
        String path = name.startsWith(from) ? to + name.substring(from.length()) : name;
        File target = new File(out, path);
        target.getParentFile().mkdirs();
        Files.write(target.toPath(), content);
    }

    /** @return the class file {@code bytes} with {@code from} replaced by {@code to} in every CONSTANT_Utf8 entry */
    static byte[] relocate(byte[] bytes, String from, String to) throws IOException {
        String dottedFrom = from.replace('/', '.');
        String dottedTo = to.replace('/', '.');
        DataInputStream in = new DataInputStream(new java.io.ByteArrayInputStream(bytes));
        ByteArrayOutputStream buffer = new ByteArrayOutputStream(bytes.length + 256);
        DataOutputStream out = new DataOutputStream(buffer);
        out.writeInt(in.readInt()); // magic
        out.writeInt(in.readInt()); // minor, major version
        int count = in.readUnsignedShort();
        out.writeShort(count);
        for (int i = 1; i < count; i++) {
            int tag = in.readUnsignedByte();
            out.writeByte(tag);
            switch (tag) {
                case 1: // Utf8: a u2 length and modified UTF-8, as DataInput.readUTF reads it
                    out.writeUTF(in.readUTF().replace(from, to).replace(dottedFrom, dottedTo));
                    break;
                case 7: case 8: case 16: case 19: case 20: // Class, String, MethodType, Module, Package
                    copy(in, out, 2);
                    break;
                case 15: // MethodHandle
                    copy(in, out, 3);
                    break;
                case 3: case 4: case 9: case 10: case 11: case 12: case 17: case 18:
                    copy(in, out, 4); // Integer, Float, Field/Method/InterfaceMethodref, NameAndType, (Invoke)Dynamic
                    break;
                case 5: case 6: // Long, Double: two entries
                    copy(in, out, 8);
                    i++;
                    break;
                default:
                    throw new IOException("constant pool tag " + tag + " unknown");
            }
        }
        copy(in, out, in.available()); // the rest refers to the pool by index: unchanged
        out.flush();
        return buffer.toByteArray();
    }

    private static void copy(DataInputStream in, DataOutputStream out, int n) throws IOException {
        byte[] bytes = new byte[n];
        in.readFully(bytes);
        out.write(bytes);
    }

    private static byte[] readAll(InputStream in) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] chunk = new byte[65536];
        for (int n; (n = in.read(chunk)) > 0; ) {
            out.write(chunk, 0, n);
        }
        return out.toByteArray();
    }
}
