// "Live code" on every notebook page: the page's code cells become editable and runnable,
// against a Jupyter kernel on this machine that `make live` starts (barter_mini/book/live.py).
// Thebe is served by the book itself (thebe/, vendored at a pinned version): nothing is
// loaded from another host. Opened from the file system, the button says how to start it.
(function () {
  "use strict";

  var INSTRUCTION = "Live code needs the book's local server: run `make live` in the repository " +
    "and open the address it prints.";
  var NO_KEY = "Live code needs this tab to have opened the address `make live` printed " +
    "(it ends in #live=…, the key to your kernels): open it in this tab.";
  // The key to the kernel server arrives in the printed address's fragment, which the
  // browser never sends to a server; the tab keeps it (sessionStorage: this tab, this origin)
  // and the address bar loses it, so it is not shared with a copied link.
  var KEY_ITEM = "barter-mini-live-key";

  function keepKey() {
    var found = /(?:^#|&)live=([^&]+)/.exec(window.location.hash);
    if (!found) {
      return;
    }
    try {
      window.sessionStorage.setItem(KEY_ITEM, decodeURIComponent(found[1]));
    } catch (error) {
      return;
    }
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }

  function key() {
    try {
      return window.sessionStorage.getItem(KEY_ITEM);
    } catch (error) {
      return null;
    }
  }

  keepKey();
  var HINT = "Live: these cells run in a Python kernel on this machine. Change a value in the " +
    "parameters cell (a density, a seed) and run it and the cells below it; edits are never saved.";

  function root() {
    return new URL(document.documentElement.dataset.content_root || "./", window.location.href);
  }

  function say(status, text, state) {
    status.textContent = text;
    status.dataset.state = state;
  }

  function loadScript(url) {
    return new Promise(function (resolve, reject) {
      var script = document.createElement("script");
      script.src = url;
      script.onload = resolve;
      script.onerror = function () { reject(new Error("could not load " + url)); };
      document.head.appendChild(script);
    });
  }

  function loadStyle(url) {
    var link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = url;
    document.head.appendChild(link);
  }

  // Thebe pairs the n-th code block with the n-th output area of the page: give every code
  // cell one, so that a cell without output does not take the next cell's.
  function markCells(article) {
    var cells = article.querySelectorAll("div.cell");
    var count = 0;
    cells.forEach(function (cell) {
      // the code itself: the <pre> of the cell's input (its copy button is a sibling)
      var input = cell.querySelector(":scope > div.cell_input pre");
      if (!input) {
        return;
      }
      var output = cell.querySelector(":scope > div.cell_output");
      if (!output) {
        output = document.createElement("div");
        output.className = "cell_output docutils container";
        cell.appendChild(output);
      }
      input.setAttribute("data-executable", "true");
      input.setAttribute("data-language", "python");
      output.setAttribute("data-output", "true");
      count += 1;
    });
    return count;
  }

  async function goLive(button, status, article) {
    button.disabled = true;
    if (window.location.protocol === "file:") {
      say(status, INSTRUCTION, "instruction");
      button.disabled = false;
      return;
    }
    var token = key();
    if (!token) {
      say(status, NO_KEY, "instruction");
      button.disabled = false;
      return;
    }
    var live;
    try {
      var answer = await fetch(new URL("live.json", root()), { cache: "no-store" });
      if (!answer.ok) {
        throw new Error(String(answer.status));
      }
      live = await answer.json();
    } catch (error) {
      say(status, INSTRUCTION, "instruction");
      button.disabled = false;
      return;
    }
    say(status, "Starting a kernel…", "starting");
    loadStyle(new URL("thebe/thebe.css", root()));
    await loadScript(new URL("thebe/index.js", root()));
    markCells(article);
    var started = await window.thebe.bootstrap({
      useBinder: false,
      useJupyterLite: false,
      requestKernel: true,
      mathjaxUrl: "",
      selector: "[data-executable]",
      outputSelector: "[data-output]",
      serverSettings: { baseUrl: live.baseUrl, wsUrl: live.wsUrl, token: token, appendToken: true },
      kernelOptions: { kernelName: "python3", name: "python3" },
    });
    if (!started || !started.session) {
      say(status, "No kernel started: is `make live` still running? If it was started again, open the address it printed now.", "failed");
      button.disabled = false;
      return;
    }
    say(status, "Running the page's cells…", "running");
    var cells = window.thebe.notebook.cells;
    for (var i = 0; i < cells.length; i++) {
      var result = await cells[i].execute();
      if (result && result.error) {
        say(status, "Cell " + (i + 1) + " failed: its output says why. " + HINT, "ready");
        return;
      }
    }
    say(status, HINT, "ready");
  }

  document.addEventListener("DOMContentLoaded", function () {
    var article = document.querySelector("article.bd-article");
    if (!article || !article.querySelector("div.cell > div.cell_input")) {
      return;
    }
    var bar = document.createElement("div");
    bar.className = "live-code";
    var button = document.createElement("button");
    button.type = "button";
    button.className = "live-code-button";
    button.textContent = "Live code";
    button.title = "Edit and run this page's code cells in a kernel on this machine (make live)";
    var status = document.createElement("span");
    status.className = "live-code-status";
    status.setAttribute("role", "status");
    bar.appendChild(button);
    bar.appendChild(status);
    article.insertBefore(bar, article.firstChild);
    button.addEventListener("click", function () {
      goLive(button, status, article).catch(function (error) {
        say(status, "Live code failed: " + error.message, "failed");
        button.disabled = false;
      });
    });
  });
})();
