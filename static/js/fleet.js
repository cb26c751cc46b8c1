/* fleet dashboard: a little JavaScript on top of server-rendered pages.
 * - htmx partials poll every 2 s while the tab is visible (hx-trigger filter); when the tab
 *   becomes visible again they refresh at once, and an unchanged response is not swapped,
 *   so keyboard focus and scroll position stay put.
 * - Plotly charts fetch JSON and redraw with Plotly.react; the log tail fetches by offset.
 * Everything pauses while document.visibilityState is "hidden".
 */
(function () {
  "use strict";
  var visible = function () { return document.visibilityState === "visible"; };
  var csrf = function () {
    var m = document.querySelector('meta[name="csrf-token"]');
    return m ? m.content : "";
  };

  /* Skip swaps whose HTML equals what is shown. */
  var last = new WeakMap();
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var target = evt.detail.target;
    if (!target || !target.hasAttribute("data-live")) return;
    var body = evt.detail.serverResponse;
    if (evt.detail.xhr && evt.detail.xhr.status >= 400) { evt.detail.shouldSwap = false; return; }
    if (last.get(target) === body) { evt.detail.shouldSwap = false; return; }
    last.set(target, body);
  });

  /* Periodic work that pauses while the tab is hidden and catches up when it shows. */
  var tasks = [];
  function every(seconds, fn) {
    var task = { fn: fn, ms: seconds * 1000, at: 0 };
    tasks.push(task);
    fn();
    task.at = Date.now();
  }
  setInterval(function () {
    if (!visible()) return;
    var now = Date.now();
    tasks.forEach(function (t) { if (now - t.at >= t.ms) { t.at = now; t.fn(); } });
  }, 500);
  document.addEventListener("visibilitychange", function () {
    if (!visible()) return;
    if (window.htmx) htmx.trigger(document.body, "fleet:refresh");
    tasks.forEach(function (t) { t.at = 0; });
  });

  /* Charts: a container with data-chart-url holds .chart[data-metric] divs. */
  function drawCharts(box) {
    var note = box.parentElement.querySelector(".notice[aria-live]");
    var url = box.getAttribute("data-chart-url");
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : { available: false, message: "Charts could not be loaded (HTTP " + r.status + ")." }; })
      .then(function (payload) {
        var figures = payload.figures || {};
        if (note) note.textContent = payload.available ? "" : (payload.message || "No data yet.");
        box.hidden = !payload.available;
        if (!payload.available || !window.Plotly) return;
        box.querySelectorAll(".chart[data-metric]").forEach(function (el) {
          var fig = figures[el.getAttribute("data-metric")];
          if (!fig) return;
          var layout = Object.assign({ margin: { t: 40, r: 10, b: 40, l: 50 }, height: 260,
            legend: { orientation: "h" }, uirevision: "keep" }, fig.layout || {});
          Plotly.react(el, fig.data, layout, { responsive: true, displaylogo: false });
        });
      })
      .catch(function () { if (note) note.textContent = "Charts could not be loaded."; });
  }
  function setupCharts() {
    document.querySelectorAll("[data-chart-url]").forEach(function (box) {
      var poll = parseFloat(box.getAttribute("data-chart-poll") || "0");
      if (poll > 0) every(poll, function () { drawCharts(box); });
      else drawCharts(box);
    });
    var range = document.querySelector("[data-chart-range]");
    if (range) range.addEventListener("change", function () {
      document.querySelectorAll("[data-chart-url]").forEach(function (box) {
        var url = new URL(box.getAttribute("data-chart-url"), location.href);
        url.searchParams.set("range", range.value);
        box.setAttribute("data-chart-url", url.pathname + url.search);
        drawCharts(box);
      });
      var page = new URL(location.href);
      page.searchParams.set("range", range.value);
      history.replaceState(null, "", page);
    });
  }

  /* Log tail: GET url?offset=N returns {data, next_offset, complete, attempt}. `complete`
   * can come before the last chunks of a finished job arrive, so polling stops only after
   * several empty answers in a row; a new attempt starts a new log. */
  function setupLog() {
    var pre = document.getElementById("log");
    if (!pre) return;
    var url = pre.getAttribute("data-logs-url");
    var offset = 0, started = false, idle = 0, attempt = null, rank = 0;
    var picker = document.getElementById("log-rank");
    if (picker) {
      picker.addEventListener("change", function () {
        /* Another member's log: start it from its first byte. */
        rank = parseInt(picker.value, 10) || 0;
        offset = 0; started = false; idle = 0; attempt = null;
        pre.textContent = "Waiting for output…";
      });
    }
    every(2, function () {
      if (idle >= 5) return;
      var u = new URL(url, location.href);
      u.searchParams.set("offset", offset);
      u.searchParams.set("rank", rank);
      var asked = rank;
      fetch(u, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (d) {
          if (!d || asked !== rank) return; /* an answer for the member shown before */
          if (attempt !== null && d.attempt !== undefined && d.attempt !== attempt) {
            pre.textContent += "\n--- attempt " + d.attempt + " ---\n";
            offset = 0; attempt = d.attempt; idle = 0; return;
          }
          if (d.attempt !== undefined) attempt = d.attempt;
          var text = d.data || "";
          offset = typeof d.next_offset === "number" ? d.next_offset : offset + text.length;
          if (text) {
            idle = 0;
            var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
            if (!started) { pre.textContent = ""; started = true; }
            pre.textContent += text;
            if (atBottom) pre.scrollTop = pre.scrollHeight;
          } else {
            if (d.complete) idle += 1;
            if (!started && d.complete) pre.textContent = "No output.";
          }
        })
        .catch(function () {});
    });
  }

  /* What-if line on the submit form: POST the form as JSON to the estimate endpoint. */
  function setupEstimate() {
    var form = document.getElementById("submit-form");
    var out = document.getElementById("what-if");
    if (!form || !out || !form.getAttribute("data-estimate-url")) return;
    var url = form.getAttribute("data-estimate-url"), timer = null, seq = 0;
    function body() {
      var data = {};
      new FormData(form).forEach(function (v, k) {
        if (k === "csrfmiddlewaretoken" || v === "") return;
        if (k === "env") {
          var env = {};
          v.split("\n").forEach(function (line) {
            var i = line.indexOf("=");
            if (i > 0) env[line.slice(0, i).trim()] = line.slice(i + 1);
          });
          data.env = env;
        } else if (["gpus", "gpu_memory_mb", "gpu_compute_percent", "min_gpu_memory_mb",
                    "time_limit", "priority", "max_requeues", "gpus_per_node", "cpus",
                    "memory_mb"].indexOf(k) >= 0) {
          data[k] = parseInt(v, 10);
        } else if (k === "preemptible" || k === "same_group") { data[k] = true; }
        else data[k] = v;
      });
      return data;
    }
    function ask() {
      var mine = ++seq;
      fetch(url, { method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf() },
        body: JSON.stringify(body()) })
        .then(function (r) { return r.json().then(function (d) { return { ok: r.ok, d: d }; }); })
        .then(function (res) {
          if (mine !== seq) return;
          var d = res.d || {};
          if (!res.ok) {
            var fields = (d.extra && d.extra.fields) || {};
            var first = Object.keys(fields)[0];
            out.textContent = first ? "Not yet: " + fields[first][0]
              : (d.message || "No estimate for this request.");
            return;
          }
          if (d.reason) d.reason = String(d.reason).replace(/\.$/, "");
          var when = d.estimated_start ? new Date(d.estimated_start).toLocaleString() : null;
          if (d.would_start_now) out.textContent = "Would start now" + (d.node ? " on " + d.node : "") + " (" + d.policy + " policy).";
          else if (when) out.textContent = "Would start around " + when + (d.reason ? ": " + d.reason : "") + ".";
          else out.textContent = "No start estimate" + (d.reason ? ": " + d.reason : "") + ".";
        })
        .catch(function () { if (mine === seq) out.textContent = "Estimate unavailable right now."; });
    }
    form.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(ask, 400); });
    ask();
  }

  /* Copy buttons and confirmations. */
  document.addEventListener("click", function (evt) {
    var btn = evt.target.closest("[data-copy]");
    if (btn) {
      var src = document.querySelector(btn.getAttribute("data-copy"));
      var text = src ? (src.value !== undefined && src.tagName === "INPUT" ? src.value : src.textContent) : "";
      var done = function () { btn.textContent = "Copied"; setTimeout(function () { btn.textContent = "Copy"; }, 1500); };
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done);
      else {
        var range = document.createRange(); range.selectNodeContents(src);
        var sel = getSelection(); sel.removeAllRanges(); sel.addRange(range);
        try { document.execCommand("copy"); done(); } catch (e) { /* text stays selected */ }
      }
    }
  });
  document.addEventListener("submit", function (evt) {
    var b = evt.submitter || evt.target.querySelector("[data-confirm]");
    if (b && b.hasAttribute && b.hasAttribute("data-confirm") && !confirm(b.getAttribute("data-confirm"))) {
      evt.preventDefault();
    }
  });

  // Scheduler settings: choosing a policy opens the parameter groups it reads.
  document.addEventListener("change", function (evt) {
    var picker = evt.target;
    if (!picker || picker.id !== "id_policy" || !picker.form) return;
    picker.form.querySelectorAll("details.param-group").forEach(function (d) {
      var readers = (d.getAttribute("data-policies") || "").split(" ");
      d.open = d.getAttribute("data-group") === "shared" || readers.indexOf(picker.value) >= 0;
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    setupCharts(); setupLog(); setupEstimate();
  });
})();
