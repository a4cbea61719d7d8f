// A notebook's first output as a person meets it: JupyterLab (started by scripts/jupyter, which
// sources scripts/kernel.sh) in a real browser (Debian's headless Chromium, driven by
// playwright-core), the notebook opened, and, once its kernel is idle, Run All clicked in the
// Run menu. Prints, per notebook, seconds from opening to the kernel idle, from Run All to the
// first output, and from Run All to the last cell done; with --at-once, every notebook is opened
// at the same time, each in its page. Autosave is off and the workspace is
// reset at each opening (settings and workspaces folders of its own), so the notebooks stay as
// they are in the checkout and each page opens its one notebook alone.
//
//     npm install --prefix /tmp/pw playwright-core          # once
//     NODE_PATH=/tmp/pw/node_modules node scripts/notebook-browser-timing.mjs [--at-once] notebooks/budget-vram.ipynb ...
//
// (recorded in docs/benchmarks.md, "Notebooks: time to first result").
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const atOnce = process.argv[2] === "--at-once";
const notebooks = process.argv.slice(atOnce ? 3 : 2);
if (notebooks.length === 0) {
  console.error("usage: notebook-browser-timing.mjs [--at-once] NOTEBOOK.ipynb ...");
  process.exit(64);
}
const port = process.env.IGL_PORT ?? "8899";
const token = "timing";
const base = `http://127.0.0.1:${port}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const settings = mkdtempSync(join(tmpdir(), "igl-lab-settings-"));
const workspaces = mkdtempSync(join(tmpdir(), "igl-lab-workspaces-"));
mkdirSync(join(settings, "@jupyterlab", "docmanager-extension"), { recursive: true });
writeFileSync(join(settings, "@jupyterlab", "docmanager-extension", "plugin.jupyterlab-settings"),
  JSON.stringify({ autosave: false }));
const lab = spawn(join(root, "scripts", "jupyter"),
  [`--IdentityProvider.token=${token}`, `--LabApp.workspaces_dir=${workspaces}`], {
  env: { ...process.env, IGL_PORT: port, JUPYTERLAB_SETTINGS_DIR: settings },
  stdio: ["ignore", "ignore", "pipe"],
});
let labLog = "";
lab.stderr.on("data", (d) => { labLog += d; });

async function api(path) {
  const r = await fetch(`${base}${path}`, { headers: { Authorization: `token ${token}` } });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function waitFor(what, test, seconds) {
  const until = Date.now() + seconds * 1000;
  for (;;) {
    try { if (await test()) return; } catch { /* not up yet */ }
    if (Date.now() > until) throw new Error(`${what}: not within ${seconds} s`);
    await sleep(50);
  }
}

// The kernel of the session open on `name`: its execution state.
async function kernelState(name) {
  const sessions = await api("/api/sessions");
  const s = sessions.find((s) => s.path.endsWith(name));
  return s?.kernel?.execution_state;
}

let status = 0;
const browser = await (async () => {
  await waitFor("JupyterLab answering", async () => (await api("/api/status")) !== null, 120);
  return chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
})();
// One notebook opened in a page of its own: seconds from opening to its kernel idle, from Run All
// to the first output and to the last cell done.
async function timeNotebook(notebook) {
  const name = basename(notebook);
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const opened = Date.now();
  await page.goto(`${base}/lab/tree/${name}?reset&token=${token}`);
  await waitFor("the kernel started", async () => (await kernelState(name)) !== undefined, 120);
  await waitFor("the kernel idle", async () => (await kernelState(name)) === "idle", 600);
  const idle = Date.now();
  await page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").first().waitFor();
  await page.getByRole("menuitem", { name: "Run", exact: true }).click();
  await page.getByText("Run All Cells", { exact: true }).click();
  const runAll = Date.now();
  const outputs = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output");
  await outputs.first().waitFor({ timeout: 600_000 });
  const first = Date.now();
  // Done: the kernel idle again with no cell waiting ("[*]").
  await waitFor("every cell run", async () => {
    const waiting = await page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt")
      .filter({ hasText: "[*]" }).count();
    return waiting === 0 && (await kernelState(name)) === "idle";
  }, 900);
  const done = Date.now();
  await page.close();
  const s = (ms) => `${(ms / 1000).toFixed(1)} s`;
  return `| ${name} | ${s(idle - opened)} | ${s(first - runAll)} | ${s(done - runAll)} |`;
}

// Shuts down the kernels of the sessions open on `name`.
async function closeSessions(name) {
  const sessions = await api("/api/sessions");
  for (const ses of sessions.filter((x) => x.path.endsWith(name))) {
    await fetch(`${base}/api/sessions/${ses.id}`, {
      method: "DELETE", headers: { Authorization: `token ${token}` },
    });
  }
}

try {
  console.log("| notebook | opened to kernel idle | Run All to first output | Run All to last cell done |");
  console.log("| --- | ---: | ---: | ---: |");
  if (atOnce) {
    // Every notebook opened at the same time, each in its page with its kernel.
    const rows = await Promise.all(notebooks.map(timeNotebook));
    rows.forEach((row) => console.log(row));
    for (const notebook of notebooks) await closeSessions(basename(notebook));
  } else {
    // One after the other, a fresh kernel each.
    for (const notebook of notebooks) {
      console.log(await timeNotebook(notebook));
      await closeSessions(basename(notebook));
    }
  }
} catch (e) {
  console.error(`${e.message}\n--- JupyterLab's log ---\n${labLog.slice(-4000)}`);
  status = 1;
} finally {
  await browser.close();
  // SIGTERM: the server shuts its kernels down before it exits.
  lab.kill("SIGTERM");
  await new Promise((r) => lab.exitCode !== null ? r() : lab.once("exit", r));
  rmSync(settings, { recursive: true, force: true });
  rmSync(workspaces, { recursive: true, force: true });
}
process.exit(status);
