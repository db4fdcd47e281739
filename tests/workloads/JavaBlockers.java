// Java threads blocked in known ways, each in methods of its own, that
// print the JVM's own view of their stacks (Thread.getAllStackTraces())
// once every one of them is blocked: the judge of the Java frames in the
// profiler's stacks (tests/it/java.rs).
//
//     java -cp DIR JavaBlockers [JNI_LIBRARY]
//
// Threads (their names longer than the kernel's 15 characters):
//   blockers-sleeper-thread    Thread.sleep
//   blockers-queue-taker       LinkedBlockingQueue.take on an empty queue
//   blockers-monitor-holder    holds a monitor, sleeping
//   blockers-monitor-waiter    a contended synchronized block
//   blockers-object-waiter     Object.wait
//   blockers-socket-reader     a socket read with nothing to read
//   blockers-hot-compiled      a wait under a hot method with an inlined
//                              callee (compiled by C2 after a warm-up)
//   blockers-mixed-frames      a wait in compiled code called from
//                              interpreted code called from compiled
//                              code (the middle method kept from the
//                              compilers: run with the JVM options of
//                              JVM_OPTIONS below)
//   blockers-jni-caller        a native method that blocks (with the
//                              JNI library's path as the argument)
//   blockers-deoptimized       a wait in compiled code with an inlined
//                              callee, whose compiled method is then
//                              invalidated (a class loaded): the frame is
//                              to be deoptimized when the wait ends, its
//                              return address the method's deoptimization
//                              handler
//
// JVM_OPTIONS: -XX:CompileCommand=quiet
//              -XX:CompileCommand=exclude,JavaBlockers::mixedMiddle
//              -XX:CompileCommand=dontinline,JavaBlockers::deoptBlock
//              -XX:CompileCommand=exclude,JavaBlockers::spinInterpreted
//
// Once the threads above are reported, two more run, not reported (their
// stacks change as they run):
//   blockers-tick-producer     puts an element in a queue every 50 ms
//   blockers-tick-consumer     takes them: each of its waits ended by the
//                              producer's Java code (its waker)
//   blockers-cpu-spinner       runs compiled code 1 ms in every 20
//                              (spinOuter, spinInner), then interpreted
//                              code 1 ms (spinInterpreted, kept from the
//                              compilers): on-CPU samples and preemptions
//                              stop it in the middle of its code, not at
//                              a call
//
// Output, once all are blocked: for each thread, `THREAD name`, then one
// `FRAME class.method file:line` per frame, innermost first, then `END`;
// last `READY pid`. The threads then stay blocked until the process is
// killed.
import java.io.InputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

public class JavaBlockers {
    static final CountDownLatch started = new CountDownLatch(10);
    static final Object monitor = new Object();
    static final Object waitObject = new Object();
    static final LinkedBlockingQueue<Integer> queue = new LinkedBlockingQueue<>();
    static final LinkedBlockingQueue<Integer> hotQueue = new LinkedBlockingQueue<>();
    static final LinkedBlockingQueue<Integer> mixedQueue = new LinkedBlockingQueue<>();
    static final LinkedBlockingQueue<Integer> deoptQueue = new LinkedBlockingQueue<>();

    static native void nativeBlock();

    // Thread.sleep, two calls down.
    static void sleeperOuter() throws InterruptedException {
        sleeperInner();
    }

    static void sleeperInner() throws InterruptedException {
        started.countDown();
        Thread.sleep(1_000_000_000L);
    }

    static void takeFromQueue() throws InterruptedException {
        started.countDown();
        queue.take();
    }

    static void holdMonitor() throws InterruptedException {
        synchronized (monitor) {
            started.countDown();
            Thread.sleep(1_000_000_000L);
        }
    }

    static void enterMonitor() {
        started.countDown();
        synchronized (monitor) {
            System.out.println("unreachable");
        }
    }

    static void waitOnObject() throws InterruptedException {
        synchronized (waitObject) {
            started.countDown();
            waitObject.wait();
        }
    }

    static void readSocket(Socket s) throws Exception {
        InputStream in = s.getInputStream();
        started.countDown();
        in.read();
    }

    // The hot method and its callee: compiled (C2) during the warm-up,
    // where the queue always has an element, so that the poll that
    // finally waits is reached from compiled code, the callee inlined.
    static int hotLoop(int i) throws InterruptedException {
        return inlinedCallee(i) + 1;
    }

    static int inlinedCallee(int i) throws InterruptedException {
        Integer v = hotQueue.poll(1_000_000_000L, TimeUnit.SECONDS);
        return v == null ? i : v + i;
    }

    static void runHot() throws InterruptedException {
        long sum = 0;
        for (int i = 0; i < 300_000; i++) {
            hotQueue.offer(i);
            sum += hotLoop(i);
        }
        if (sum == 42) {
            System.out.println("unlikely");
        }
        started.countDown();
        hotLoop(-1);
    }

    // Compiled, calling the interpreted middle (the compilers are kept
    // from it), which calls the compiled inner method: the walk crosses
    // from compiled code into the interpreter's frame (whose locals
    // extend its caller's frame) and back.
    static int mixedOuter(int i) throws InterruptedException {
        return mixedMiddle(i) + 1;
    }

    static int mixedMiddle(int i) throws InterruptedException {
        int a = i * 3;
        int b = a ^ 5;
        long c = (long) b * a;
        return mixedInner(i) + (int) (c & 1);
    }

    static int mixedInner(int i) throws InterruptedException {
        Integer v = mixedQueue.poll(1_000_000_000L, TimeUnit.SECONDS);
        return v == null ? i : v + i;
    }

    static void runMixed() throws InterruptedException {
        long sum = 0;
        for (int i = 0; i < 100_000; i++) {
            mixedQueue.offer(i);
            sum += mixedOuter(i);
        }
        if (sum == 42) {
            System.out.println("unlikely");
        }
        started.countDown();
        mixedOuter(-1);
    }

    // An abstract class with one subclass loaded: the compiler inlines
    // `sides()` on that ground (a dependency of the compiled method), and
    // loading the second subclass (Square, by name: nothing else refers
    // to it) invalidates the compiled method.
    abstract static class Shape {
        abstract int sides();
    }

    static final class Triangle extends Shape {
        int sides() {
            return 3;
        }
    }

    static final class Square extends Shape {
        int sides() {
            return 4;
        }
    }

    static int deoptOuter(Shape s, int i) throws InterruptedException {
        return deoptInlined(s, i) + 1;
    }

    static int deoptInlined(Shape s, int i) throws InterruptedException {
        return deoptBlock(i) * s.sides();
    }

    // Kept from being inlined (JVM_OPTIONS): its own compiled code, which
    // the wait leaves for the interpreter (the compiler never saw the
    // queue empty), while its caller's compiled frame stays.
    static int deoptBlock(int i) throws InterruptedException {
        Integer v = deoptQueue.poll(1_000_000_000L, TimeUnit.SECONDS);
        return v == null ? i : v + i;
    }

    static void warmDeopt(Shape s) throws InterruptedException {
        long sum = 0;
        for (int i = 0; i < 300_000; i++) {
            deoptQueue.offer(i);
            sum += deoptOuter(s, i);
        }
        if (sum == 42) {
            System.out.println("unlikely");
        }
    }

    // The wait is called from here (run once: interpreted, never
    // compiled with its callee inlined), into deoptOuter's compiled code,
    // once the compiler is done with it (the second warm-up).
    static void runDeopt() throws InterruptedException {
        Shape s = new Triangle();
        warmDeopt(s);
        Thread.sleep(500);
        warmDeopt(s);
        started.countDown();
        deoptOuter(s, -1);
    }

    static final LinkedBlockingQueue<Integer> tickQueue = new LinkedBlockingQueue<>();

    static void tickProducer() throws InterruptedException {
        for (int i = 0; ; i++) {
            Thread.sleep(50);
            tickQueue.put(i);
        }
    }

    static void tickConsumer() throws InterruptedException {
        while (true) {
            tickQueue.take();
        }
    }

    static volatile long spinSink;

    static long spinInner(long x) {
        for (int i = 0; i < 1000; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            x ^= x >>> 29;
        }
        return x;
    }

    static long spinInterpreted(long x) {
        for (int i = 0; i < 1000; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            x ^= x >>> 29;
        }
        return x;
    }

    static void spinOuter() throws InterruptedException {
        long x = 1;
        while (true) {
            long end = System.nanoTime() + 1_000_000;
            while (System.nanoTime() < end) {
                x = spinInner(x);
            }
            end = System.nanoTime() + 1_000_000;
            while (System.nanoTime() < end) {
                x = spinInterpreted(x);
            }
            spinSink = x;
            Thread.sleep(18);
        }
    }

    static void callNative() {
        started.countDown();
        nativeBlock();
    }

    interface Body {
        void run() throws Exception;
    }

    static Thread start(String name, Body body) {
        Thread t = new Thread(() -> {
            try {
                body.run();
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        }, name);
        t.setDaemon(true);
        t.start();
        return t;
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0) {
            System.load(args[0]);
        }
        ServerSocket server = new ServerSocket(0, 1, InetAddress.getLoopbackAddress());
        Socket client = new Socket(InetAddress.getLoopbackAddress(), server.getLocalPort());
        Socket accepted = server.accept();
        List<Thread> threads = new ArrayList<>();
        threads.add(start("blockers-sleeper-thread", JavaBlockers::sleeperOuter));
        threads.add(start("blockers-queue-taker", JavaBlockers::takeFromQueue));
        threads.add(start("blockers-monitor-holder", JavaBlockers::holdMonitor));
        // The holder first, so that the waiter finds the monitor taken.
        while (threads.get(2).getState() != Thread.State.TIMED_WAITING) {
            Thread.sleep(1);
        }
        threads.add(start("blockers-monitor-waiter", JavaBlockers::enterMonitor));
        threads.add(start("blockers-object-waiter", JavaBlockers::waitOnObject));
        threads.add(start("blockers-socket-reader", () -> readSocket(accepted)));
        threads.add(start("blockers-hot-compiled", JavaBlockers::runHot));
        threads.add(start("blockers-mixed-frames", JavaBlockers::runMixed));
        threads.add(start("blockers-deoptimized", JavaBlockers::runDeopt));
        if (args.length > 0) {
            threads.add(start("blockers-jni-caller", JavaBlockers::callNative));
        } else {
            started.countDown();
        }
        started.await();
        // Each thread reached its block (the socket reader and the JNI
        // caller are RUNNABLE to the JVM while they wait in the kernel).
        for (Thread t : threads) {
            while (t.getState() == Thread.State.RUNNABLE
                    && !t.getName().equals("blockers-socket-reader")
                    && !t.getName().equals("blockers-jni-caller")) {
                Thread.sleep(1);
            }
        }
        // The second shape: the waiting compiled frame is to be
        // deoptimized.
        Class.forName("JavaBlockers$Square").getDeclaredConstructor().newInstance();
        Thread.sleep(200);
        StringBuilder out = new StringBuilder();
        for (Map.Entry<Thread, StackTraceElement[]> e : Thread.getAllStackTraces().entrySet()) {
            if (!threads.contains(e.getKey())) {
                continue;
            }
            out.append("THREAD ").append(e.getKey().getName()).append('\n');
            for (StackTraceElement f : e.getValue()) {
                out.append("FRAME ").append(f.getClassName()).append('.').append(f.getMethodName())
                        .append(' ').append(f.getFileName()).append(':').append(f.getLineNumber())
                        .append('\n');
            }
            out.append("END\n");
        }
        out.append("READY ").append(ProcessHandle.current().pid()).append('\n');
        System.out.print(out);
        System.out.flush();
        start("blockers-tick-producer", JavaBlockers::tickProducer);
        start("blockers-tick-consumer", JavaBlockers::tickConsumer);
        start("blockers-cpu-spinner", JavaBlockers::spinOuter);
        client.getOutputStream().flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}
