// A realistic pgjdbc session through the lsngate proxy (or, as the control, straight against
// PostgreSQL): the connection settings Java applications run with — autosave=conservative and
// always, prepareThreshold crossings (default 5, 1 with a small statement cache, 0),
// reWriteBatchedInserts, fetch size inside a transaction (portal suspended and resumed), the
// CopyManager both ways, Statement.cancel(), LISTEN/NOTIFY — and read-after-write checks that
// count how many reads a replica served. Every step runs on connections of its own, so one
// failure does not hide the next; the program prints one line per step and a summary, and exits
// 1 when any step failed.
//
// Usage: java -cp BUILD:/usr/share/java/postgresql.jar PgjdbcSession URL TABLE NODE_URL...
// (URLs in libpq form, postgres://user@host:port/db; the nodes are every server behind URL, asked
// directly whether the cancelled statement runs). Compiled by tests/proxy/drivers.rs.

import java.io.StringReader;
import java.io.StringWriter;
import java.net.URI;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.PGStatement;
import org.postgresql.copy.CopyManager;

public final class PgjdbcSession {
  private static String baseUrl;
  private static String table;
  private static final List<String> nodes = new ArrayList<>();
  private static final List<String> failed = new ArrayList<>();
  private static int steps;
  private static int reads;
  private static int replicaReads;

  interface Body {
    void run() throws Exception;
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 3) {
      System.err.println("usage: PgjdbcSession URL TABLE NODE_URL... (libpq URLs: postgres://user@host:port/db;"
          + " the nodes are asked directly whether the cancelled statement runs)");
      System.exit(2);
    }
    baseUrl = jdbcUrl(args[0]) + "&ApplicationName=pgjdbc-session";
    table = args[1];
    for (int i = 2; i < args.length; i++) {
      nodes.add(jdbcUrl(args[i]));
    }

    step("setup", PgjdbcSession::setup);
    step("read_after_write (prepareThreshold=5 crossed)", PgjdbcSession::readAfterWrite);
    step("prepareThreshold=1 with a 2-statement cache", PgjdbcSession::prepareThresholdOne);
    step("prepareThreshold=0", PgjdbcSession::prepareThresholdZero);
    step("reWriteBatchedInserts=true", PgjdbcSession::rewrittenBatch);
    step("plain batch", PgjdbcSession::plainBatch);
    step("fetch size in a transaction", PgjdbcSession::fetchSize);
    step("CopyManager in and out", PgjdbcSession::copy);
    step("Statement.cancel of pg_sleep", PgjdbcSession::cancel);
    step("LISTEN/NOTIFY", PgjdbcSession::listenNotify);
    step("autosave=always: error mid-transaction recovers", PgjdbcSession::autosaveAlways);
    step("autosave=conservative: error then rollback", PgjdbcSession::autosaveConservative);
    step("autosave=conservative: changed plan healed", PgjdbcSession::autosaveChangedPlan);

    String version = org.postgresql.util.DriverInfo.DRIVER_VERSION;
    String counts = "reads=" + reads + " replica=" + replicaReads;
    if (failed.isEmpty()) {
      System.out.println("OK pgjdbc " + version + ": " + steps + " steps, " + counts);
    } else {
      System.out.println("FAILED pgjdbc " + version + ": " + failed.size() + " of " + steps
          + " steps: " + String.join("; ", failed) + " (" + counts + ")");
      System.exit(1);
    }
  }

  /** postgres://user@host:port/db as a JDBC URL with bounds, so no step can hang the run (the
   * pg_sleep below is 60 s, cancelled long before). */
  private static String jdbcUrl(String libpq) throws Exception {
    URI uri = new URI(libpq);
    String user = uri.getUserInfo() == null ? "postgres" : uri.getUserInfo().split(":")[0];
    return "jdbc:postgresql://" + uri.getHost() + ":" + uri.getPort() + uri.getPath()
        + "?user=" + user + "&connectTimeout=10&socketTimeout=120";
  }

  private static void step(String name, Body body) {
    steps++;
    try {
      body.run();
      System.out.println("ok   " + name);
    } catch (Throwable e) {
      failed.add(name);
      System.out.println("FAIL " + name + ": " + describe(e));
    }
    System.out.flush();
  }

  private static String describe(Throwable e) {
    StringBuilder text = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (text.length() > 0) {
        text.append(" <- ");
      }
      text.append(t.getClass().getSimpleName());
      if (t instanceof SQLException && ((SQLException) t).getSQLState() != null) {
        text.append(" [").append(((SQLException) t).getSQLState()).append("]");
      }
      text.append(": ").append(t.getMessage());
      if (t.getCause() == t) {
        break;
      }
    }
    return text.toString();
  }

  private static Connection connect(String settings) throws SQLException {
    return DriverManager.getConnection(settings.isEmpty() ? baseUrl : baseUrl + "&" + settings);
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      throw new AssertionError(what);
    }
  }

  private static void expectState(SQLException e, String state, String what) throws SQLException {
    if (!state.equals(e.getSQLState())) {
      throw new AssertionError(what + ": expected SQLSTATE " + state + ", got " + describe(e));
    }
  }

  /** Reads row `id` back on `conn` (the read-after-write check) and counts who served it. */
  private static void readBack(Connection conn, int id, String note) throws SQLException {
    try (PreparedStatement select =
        conn.prepareStatement("SELECT note, pg_is_in_recovery() FROM " + table + " WHERE id = ?")) {
      select.setInt(1, id);
      try (ResultSet rs = select.executeQuery()) {
        reads++;
        check(rs.next(), "row " + id + " written on this connection was not read back (stale read)");
        check(note.equals(rs.getString(1)), "row " + id + ": note " + rs.getString(1) + ", wrote " + note);
        if (rs.getBoolean(2)) {
          replicaReads++;
        }
      }
    }
  }

  private static long count(Connection conn, int from, int to) throws SQLException {
    try (PreparedStatement select = conn.prepareStatement(
        "SELECT count(*) FROM " + table + " WHERE id BETWEEN ? AND ?")) {
      select.setInt(1, from);
      select.setInt(2, to);
      try (ResultSet rs = select.executeQuery()) {
        rs.next();
        return rs.getLong(1);
      }
    }
  }

  private static void setup() throws SQLException {
    try (Connection conn = connect(""); Statement st = conn.createStatement()) {
      st.execute("CREATE TABLE " + table + " (id int PRIMARY KEY, note text)");
    }
  }

  /** Insert then select back, 40 times on one connection: both statements cross the default
   * prepareThreshold (5) and become named server-side statements on the way. */
  private static void readAfterWrite() throws SQLException {
    try (Connection conn = connect("");
        PreparedStatement insert =
            conn.prepareStatement("INSERT INTO " + table + " (id, note) VALUES (?, ?)")) {
      for (int id = 1; id <= 40; id++) {
        insert.setInt(1, id);
        insert.setString(2, "raw" + id);
        check(insert.executeUpdate() == 1, "insert " + id);
        readBack(conn, id, "raw" + id);
      }
      check(insert.unwrap(PGStatement.class).isUseServerPrepare(),
          "the insert did not become a server-side prepared statement after 40 executions");
    }
  }

  /** Named statements from the first execution, and a statement cache of 2 so pgjdbc closes
   * (Close message) the statements it evicts while four distinct ones cycle. */
  private static void prepareThresholdOne() throws SQLException {
    try (Connection conn = connect("prepareThreshold=1&preparedStatementCacheQueries=2")) {
      String[] selects = {
        "SELECT count(*) FROM " + table + " WHERE id >= ? AND id < 200",
        "SELECT count(*) FROM " + table + " WHERE id > ? AND id < 200",
        "SELECT count(*) FROM " + table + " WHERE id >= ? AND id < 200 AND note IS NOT NULL",
        "SELECT count(*) FROM " + table + " WHERE id > ? AND id < 200 AND note IS NOT NULL",
      };
      for (int round = 0; round < 5; round++) {
        int id = 100 + round;
        try (PreparedStatement insert =
            conn.prepareStatement("INSERT INTO " + table + " (id, note) VALUES (?, ?)")) {
          check(insert.unwrap(PGStatement.class).isUseServerPrepare(), "threshold 1: not server-prepared");
          insert.setInt(1, id);
          insert.setString(2, "t1-" + id);
          insert.executeUpdate();
        }
        readBack(conn, id, "t1-" + id);
        for (int q = 0; q < selects.length; q++) {
          try (PreparedStatement select = conn.prepareStatement(selects[q])) {
            select.setInt(1, 100);
            try (ResultSet rs = select.executeQuery()) {
              rs.next();
              long expected = q % 2 == 0 ? round + 1 : round;
              check(rs.getLong(1) == expected,
                  "statement " + q + " round " + round + ": " + rs.getLong(1) + " rows, expected " + expected);
            }
          }
        }
      }
    }
  }

  /** prepareThreshold=0: never a named statement, every execution Parse "" + Bind + Execute. */
  private static void prepareThresholdZero() throws SQLException {
    try (Connection conn = connect("prepareThreshold=0");
        PreparedStatement insert =
            conn.prepareStatement("INSERT INTO " + table + " (id, note) VALUES (?, ?)")) {
      for (int id = 200; id < 210; id++) {
        insert.setInt(1, id);
        insert.setString(2, "t0-" + id);
        insert.executeUpdate();
        readBack(conn, id, "t0-" + id);
      }
      check(!insert.unwrap(PGStatement.class).isUseServerPrepare(), "threshold 0 server-prepared");
    }
  }

  /** reWriteBatchedInserts: 137 rows sent as multi-row INSERTs (blocks of 128, 8, 1). */
  private static void rewrittenBatch() throws SQLException {
    try (Connection conn = connect("reWriteBatchedInserts=true");
        PreparedStatement insert =
            conn.prepareStatement("INSERT INTO " + table + " (id, note) VALUES (?, ?)")) {
      for (int id = 1000; id < 1137; id++) {
        insert.setInt(1, id);
        insert.setString(2, "rw" + id);
        insert.addBatch();
      }
      int[] counts = insert.executeBatch();
      check(counts.length == 137, counts.length + " batch results for 137 rows");
      for (int c : counts) {
        check(c == 1 || c == Statement.SUCCESS_NO_INFO, "batch result " + c);
      }
      check(count(conn, 1000, 1136) == 137, "rewritten batch: " + count(conn, 1000, 1136) + " of 137 rows");
      readBack(conn, 1136, "rw1136");
    }
  }

  /** A batch without rewriting: many Bind/Execute pairs before one Sync, in a transaction. */
  private static void plainBatch() throws SQLException {
    try (Connection conn = connect("")) {
      conn.setAutoCommit(false);
      try (PreparedStatement insert =
          conn.prepareStatement("INSERT INTO " + table + " (id, note) VALUES (?, ?)")) {
        for (int id = 1200; id < 1220; id++) {
          insert.setInt(1, id);
          insert.setString(2, "b" + id);
          insert.addBatch();
        }
        int[] counts = insert.executeBatch();
        check(counts.length == 20, counts.length + " batch results for 20 rows");
      }
      conn.commit();
      conn.setAutoCommit(true);
      check(count(conn, 1200, 1219) == 20, "plain batch rows");
      readBack(conn, 1219, "b1219");
    }
  }

  /** setFetchSize inside a transaction: the portal is suspended after each 50 rows and resumed
   * with Execute(max_rows); a second statement runs between two fetches of the first. */
  private static void fetchSize() throws SQLException {
    try (Connection conn = connect("")) {
      conn.setAutoCommit(false);
      try (Statement fill = conn.createStatement()) {
        fill.executeUpdate("INSERT INTO " + table + " (id, note) SELECT g, 'f' || g FROM generate_series(2000, 2499) g");
      }
      try (PreparedStatement select = conn.prepareStatement(
          "SELECT id, note FROM " + table + " WHERE id BETWEEN ? AND ? ORDER BY id")) {
        select.setFetchSize(50);
        select.setInt(1, 2000);
        select.setInt(2, 2499);
        int rows = 0;
        long sum = 0;
        try (ResultSet rs = select.executeQuery()) {
          while (rs.next()) {
            rows++;
            sum += rs.getInt(1);
            check(("f" + rs.getInt(1)).equals(rs.getString(2)), "row " + rs.getInt(1));
            if (rows == 75) {
              // Another statement while the portal is suspended.
              check(count(conn, 2000, 2499) == 500, "count inside the transaction");
            }
          }
        }
        check(rows == 500, rows + " rows fetched of 500");
        check(sum == (2000L + 2499L) * 500 / 2, "sum of ids " + sum);
      }
      try (Statement st = conn.createStatement()) {
        st.setFetchSize(7);
        int rows = 0;
        try (ResultSet rs = st.executeQuery("SELECT g FROM generate_series(1, 100) g")) {
          while (rs.next()) {
            rows++;
          }
        }
        check(rows == 100, rows + " of 100 generate_series rows at fetch size 7");
      }
      conn.commit();
      conn.setAutoCommit(true);
      readBack(conn, 2499, "f2499");
    }
  }

  private static void copy() throws Exception {
    try (Connection conn = connect("")) {
      CopyManager copy = conn.unwrap(PGConnection.class).getCopyAPI();
      StringBuilder data = new StringBuilder();
      for (int id = 3000; id < 3200; id++) {
        data.append(id).append('\t').append("copy ").append(id).append('\n');
      }
      long in = copy.copyIn("COPY " + table + " (id, note) FROM STDIN", new StringReader(data.toString()));
      check(in == 200, "COPY FROM STDIN reported " + in + " rows of 200");
      StringWriter out = new StringWriter();
      long outRows = copy.copyOut(
          "COPY (SELECT id, note FROM " + table + " WHERE id BETWEEN 3000 AND 3199 ORDER BY id) TO STDOUT", out);
      check(outRows == 200, "COPY TO STDOUT reported " + outRows + " rows of 200 just copied in");
      check(out.toString().equals(data.toString()), "COPY TO STDOUT returned other data than was copied in");
      readBack(conn, 3199, "copy 3199");
    }
  }

  /** Statement.cancel() of a 60 s pg_sleep, sent once the sleep is seen running on a server (a
   * cancel that arrives between statements cancels nothing, on PostgreSQL as through a proxy):
   * the server must end it with 57014, and the connection goes on. */
  private static void cancel() throws Exception {
    String marker = "pgjdbc-cancel-" + table;
    try (Connection conn = connect(""); Statement st = conn.createStatement()) {
      AtomicReference<Throwable> outcome = new AtomicReference<>();
      Thread running = new Thread(() -> {
        try {
          st.execute("SELECT pg_sleep(60), '" + marker + "'");
          outcome.set(new AssertionError("pg_sleep(60) finished: the cancel did not stop it"));
        } catch (Throwable e) {
          outcome.set(e);
        }
      });
      running.start();
      awaitOnNodes(marker, true);
      st.cancel();
      running.join(30_000);
      check(!running.isAlive(), "pg_sleep(60) still running 30 s after Statement.cancel()");
      Throwable e = outcome.get();
      if (!(e instanceof SQLException)) {
        throw new AssertionError("expected SQLSTATE 57014, got " + describe(e));
      }
      expectState((SQLException) e, "57014", "cancelled pg_sleep");
      awaitOnNodes(marker, false);
      try (ResultSet rs = st.executeQuery("SELECT 'alive'")) {
        check(rs.next() && rs.getString(1).equals("alive"), "connection after the cancel");
      }
    }
  }

  /** Waits (at most 20 s) until a statement containing `marker` runs on some node (`running`)
   * or on none, asking every node directly. */
  private static void awaitOnNodes(String marker, boolean running) throws Exception {
    String sql = "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
        + " AND pid <> pg_backend_pid() AND strpos(query, ?) > 0";
    for (int i = 0; i < 200; i++) {
      long active = 0;
      for (String node : nodes) {
        try (Connection conn = DriverManager.getConnection(node);
            PreparedStatement st = conn.prepareStatement(sql)) {
          st.setString(1, marker);
          try (ResultSet rs = st.executeQuery()) {
            rs.next();
            active += rs.getLong(1);
          }
        }
      }
      if ((active > 0) == running) {
        return;
      }
      Thread.sleep(100);
    }
    throw new AssertionError(running
        ? "the statement " + marker + " was not seen running on any node within 20 s"
        : "the statement " + marker + " still runs on a node 20 s after its cancel");
  }

  private static void listenNotify() throws Exception {
    String channel = table + "_channel";
    try (Connection listener = connect(""); Connection sender = connect("")) {
      try (Statement st = listener.createStatement()) {
        st.execute("LISTEN " + channel);
      }
      try (Statement st = sender.createStatement()) {
        st.execute("NOTIFY " + channel + ", 'from another connection'");
      }
      try (PreparedStatement st = listener.prepareStatement("SELECT pg_notify(?, ?)")) {
        st.setString(1, channel);
        st.setString(2, "from itself");
        st.execute();
      }
      List<String> payloads = new ArrayList<>();
      PGConnection pg = listener.unwrap(PGConnection.class);
      for (int i = 0; i < 20 && payloads.size() < 2; i++) {
        PGNotification[] notes = pg.getNotifications(500);
        if (notes != null) {
          for (PGNotification n : notes) {
            check(n.getName().equals(channel), "notification on channel " + n.getName());
            payloads.add(n.getParameter());
          }
        }
      }
      check(payloads.contains("from another connection") && payloads.contains("from itself"),
          "notifications received within 10 s: " + payloads);
    }
  }

  /** autosave=always: pgjdbc sets SAVEPOINT PGJDBC_AUTOSAVE before every statement of a
   * transaction (the first flight: BEGIN, the savepoint, the statement, Sync) and rolls back to
   * it on any error, so the transaction goes on and commits. */
  private static void autosaveAlways() throws SQLException {
    try (Connection conn = connect("autosave=always")) {
      conn.setAutoCommit(false);
      try (PreparedStatement insert =
          conn.prepareStatement("INSERT INTO " + table + " (id, note) VALUES (?, ?)")) {
        insert.setInt(1, 4000);
        insert.setString(2, "kept");
        insert.executeUpdate();
        insert.setInt(1, 4000);
        insert.setString(2, "duplicate");
        try {
          insert.executeUpdate();
          throw new AssertionError("a duplicate key was inserted");
        } catch (SQLException e) {
          expectState(e, "23505", "duplicate insert");
        }
        insert.setInt(1, 4001);
        insert.setString(2, "after the error");
        insert.executeUpdate();
      }
      check(count(conn, 4000, 4001) == 2, "rows inside the recovered transaction");
      conn.commit();
      conn.setAutoCommit(true);
      readBack(conn, 4000, "kept");
      readBack(conn, 4001, "after the error");
    }
  }

  /** autosave=conservative: pgjdbc sets its savepoint only in front of statements that return
   * rows it has described (a plan change can break only those), so the transaction opens with a
   * SELECT executed once before: BEGIN, the savepoint, the SELECT, Sync in one flight. An
   * ordinary error then aborts the transaction (pgjdbc rolls back to its savepoint only for
   * errors a retry heals); the application rolls back and goes on. */
  private static void autosaveConservative() throws SQLException {
    try (Connection conn = connect("autosave=conservative");
        PreparedStatement select = conn.prepareStatement("SELECT count(*) FROM " + table + " WHERE id >= ?");
        PreparedStatement insert =
            conn.prepareStatement("INSERT INTO " + table + " (id, note) VALUES (?, ?)")) {
      select.setInt(1, 4100);
      long before;
      try (ResultSet rs = select.executeQuery()) {
        rs.next();
        before = rs.getLong(1);
      }
      conn.setAutoCommit(false);
      try (ResultSet rs = select.executeQuery()) {
        check(rs.next() && rs.getLong(1) == before, "the transaction's first SELECT");
      }
      insert.setInt(1, 4100);
      insert.setString(2, "rolled back");
      insert.executeUpdate();
      try (Statement st = conn.createStatement()) {
        st.execute("SELECT 1/0");
        throw new AssertionError("1/0 did not fail");
      } catch (SQLException e) {
        expectState(e, "22012", "division by zero");
      }
      conn.rollback();
      insert.setInt(1, 4101);
      insert.setString(2, "next transaction");
      insert.executeUpdate();
      conn.commit();
      conn.setAutoCommit(true);
      check(count(conn, 4100, 4100) == 0, "the rolled-back insert is visible");
      readBack(conn, 4101, "next transaction");
    }
  }

  /** What autosave=conservative is for: a server-prepared SELECT * whose table changes shape
   * fails with 0A000 "cached plan must not change result type" inside a transaction; pgjdbc
   * rolls back to its savepoint, re-prepares and runs the statement again, unseen. */
  private static void autosaveChangedPlan() throws SQLException {
    String plan = table + "_plan";
    try (Connection conn = connect("autosave=conservative&prepareThreshold=1");
        PreparedStatement select = conn.prepareStatement("SELECT * FROM " + plan + " WHERE id = ?")) {
      // Created and filled on this connection, so the reads below see the row wherever they run.
      try (Statement st = conn.createStatement()) {
        st.execute("CREATE TABLE " + plan + " (id int PRIMARY KEY, a text)");
        st.execute("INSERT INTO " + plan + " VALUES (1, 'one')");
      }
      select.setInt(1, 1);
      for (int i = 0; i < 3; i++) {
        try (ResultSet rs = select.executeQuery()) {
          check(rs.next() && rs.getMetaData().getColumnCount() == 2, "before the change");
        }
      }
      try (Connection other = connect(""); Statement st = other.createStatement()) {
        st.execute("ALTER TABLE " + plan + " ADD COLUMN b text DEFAULT 'new'");
      }
      conn.setAutoCommit(false);
      try (Statement st = conn.createStatement()) {
        st.executeUpdate("UPDATE " + plan + " SET a = 'in transaction' WHERE id = 1");
      }
      try (ResultSet rs = select.executeQuery()) {
        check(rs.next(), "row 1 after the change");
        check(rs.getMetaData().getColumnCount() == 3, rs.getMetaData().getColumnCount() + " columns after the change");
        check("in transaction".equals(rs.getString("a")) && "new".equals(rs.getString("b")),
            "row after the change: " + rs.getString("a") + ", " + rs.getString("b"));
      }
      conn.commit();
    }
  }
}
