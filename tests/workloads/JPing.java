// Two Java threads passing the turn back and forth (LockSupport.park and
// unpark), each under DEPTH methods of its own: a context switch per pass,
// every one in a JVM process (scripts/bench-builds --java). After WARM
// passes (the JIT's work done), prints the time per round trip of the
// ROUNDS that follow.
//
//     java -cp DIR JPing ROUNDS [DEPTH] [WARM]
import java.util.concurrent.locks.LockSupport;

public class JPing {
    static volatile int turn;
    static volatile Thread ping;
    static volatile Thread echo;
    static int rounds;
    static int warm;
    static long started;

    interface Body {
        void run();
    }

    static void nest(int depth, Body body) {
        if (depth == 0) {
            body.run();
        } else {
            nest(depth - 1, body);
        }
    }

    // Waits for the turn of `me`, then gives it to the other thread.
    static void pass(int me, Thread other) {
        while (turn != me) {
            LockSupport.park();
        }
        turn = 1 - me;
        LockSupport.unpark(other);
    }

    static void pinger() {
        for (int i = 0; i < warm + rounds; i++) {
            if (i == warm) {
                started = System.nanoTime();
            }
            pass(0, echo);
        }
        // The last pass answered.
        while (turn != 0) {
            LockSupport.park();
        }
    }

    static void echoer() {
        for (int i = 0; i < warm + rounds; i++) {
            pass(1, ping);
        }
    }

    public static void main(String[] args) throws Exception {
        rounds = Integer.parseInt(args[0]);
        int depth = args.length > 1 ? Integer.parseInt(args[1]) : 10;
        warm = args.length > 2 ? Integer.parseInt(args[2]) : 20000;
        Thread e = new Thread(() -> nest(depth, JPing::echoer));
        Thread p = new Thread(() -> nest(depth, JPing::pinger));
        echo = e;
        ping = p;
        e.start();
        p.start();
        p.join();
        long ns = System.nanoTime() - started;
        e.join();
        System.out.printf("%.1f ns/op%n", (double) ns / rounds);
    }
}
