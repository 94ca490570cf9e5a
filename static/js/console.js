// Rebound console: draws the server-built Plotly figures, keeps badges and states
// live by polling a small JSON endpoint, and submits decision forms in place.
(function () {
  "use strict";

  // Charts: <script type="application/json" id="X" data-chart="DIV_ID">{figure}</script>
  function drawCharts(root) {
    if (!window.Plotly) return;
    root.querySelectorAll("script[data-chart]").forEach(function (src) {
      var target = document.getElementById(src.dataset.chart);
      if (!target || target.dataset.drawn) return;
      var fig = JSON.parse(src.textContent);
      window.Plotly.newPlot(target, fig.data, fig.layout, {
        responsive: true, displaylogo: false,
      });
      target.dataset.drawn = "1";
    });
  }

  // Live state: the body's data-status-url is polled every data-poll-s seconds.
  //   [data-live="NAME"]          text <- status[NAME]        (badges, counters)
  //   [data-live-action="ID"]     text and data-state <- status.actions[ID]
  //   [data-live-node="ID"]       data-state and title <- status.nodes[ID]
  //   [data-live-job="ID"]        a job's status badge <- status.jobs[ID] (running, silent...)
  //   [data-live-job-heard="ID"]  when it was last heard from, or its silent badge
  function apply(status) {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var v = status[el.dataset.live];
      if (v === undefined) return;
      el.textContent = v;
      el.dataset.count = v;
    });
    var actions = status.actions || {};
    document.querySelectorAll("[data-live-action]").forEach(function (el) {
      var a = actions[el.dataset.liveAction];
      if (!a) return;
      el.textContent = a.state.replace(/_/g, " ");
      el.dataset.state = a.state;
      var row = el.closest("[data-action-row]");
      if (row) {
        row.dataset.state = a.state;
        if (a.state !== "awaiting_approval") {
          row.querySelectorAll("form[data-decision] button").forEach(function (b) { b.disabled = true; });
        }
      }
    });
    var nodes = status.nodes || {};
    document.querySelectorAll("[data-live-node]").forEach(function (el) {
      var state = nodes[el.dataset.liveNode];
      if (!state) return;
      el.dataset.state = state;
      if (el.dataset.name) {
        var incident = el.dataset.incident ? "; open incident " + el.dataset.incident : "";
        el.title = el.dataset.name + ": " + state.replace(/_/g, " ") + incident;
      }
    });
    var jobs = status.jobs || {};
    document.querySelectorAll("[data-live-job]").forEach(function (el) {
      var j = jobs[el.dataset.liveJob];
      if (!j) return;
      el.textContent = j.label;
      el.className = "status status-" + j.activity;
    });
    document.querySelectorAll("[data-live-job-heard]").forEach(function (el) {
      var j = jobs[el.dataset.liveJobHeard];
      if (!j) return;
      el.textContent = j.silent ? j.label : j.ago;
      el.className = j.silent ? "status status-silent" : "heard";
    });
  }

  function liveIds(attribute, key) {
    var seen = {};
    document.querySelectorAll("[" + attribute + "]").forEach(function (el) { seen[el.dataset[key]] = 1; });
    return Object.keys(seen).slice(0, 500);
  }

  function poll() {
    var body = document.body;
    var url = body.dataset.statusUrl;
    if (!url) return;
    var params = new URLSearchParams();
    var ids = liveIds("data-live-action", "liveAction");
    if (ids.length) params.set("actions", ids.join(","));
    var jobs = liveIds("data-live-job", "liveJob").concat(liveIds("data-live-job-heard", "liveJobHeard"));
    if (jobs.length) params.set("jobs", jobs.slice(0, 500).join(","));
    if (body.dataset.liveNodes) params.set("nodes", body.dataset.liveNodes);
    fetch(url + "?" + params.toString(), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (status) { if (status) apply(status); })
      .catch(function () { /* the next poll tries again */ })
      .finally(function () {
        setTimeout(poll, 1000 * (parseFloat(body.dataset.pollS) || 5));
      });
  }

  // Forms marked data-async post in place (CSRF token from the form) and show the
  // answer in their [data-async-result]; live polling then shows the new state.
  function asyncForms() {
    document.querySelectorAll("form[data-async]").forEach(function (form) {
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        var out = form.querySelector("[data-async-result]");
        // Only the buttons enabled now: one rendered disabled (the two-person rule) stays so.
        var buttons = Array.prototype.filter.call(
          form.querySelectorAll("button, input[type=submit]"), function (b) { return !b.disabled; });
        buttons.forEach(function (b) { b.disabled = true; });
        var data = new FormData(form);
        if (ev.submitter && ev.submitter.name) data.set(ev.submitter.name, ev.submitter.value);
        fetch(form.action, {
          method: "POST", body: data, credentials: "same-origin",
          headers: { Accept: "application/json", "X-CSRFToken": data.get("csrfmiddlewaretoken") },
        })
          .then(function (r) { return r.json().then(function (j) { return [r.ok, j]; }); })
          .then(function (res) {
            if (out) {
              out.textContent = res[1].detail || res[1].message || "";
              out.dataset.ok = res[0] ? "1" : "0";
            }
            // A decision is made once; other forms (a node's actions) may be used again.
            if (!res[0] || !form.hasAttribute("data-decision")) {
              buttons.forEach(function (b) { b.disabled = false; });
            }
            if (res[1].state && form.dataset.async) {
              apply({ actions: (function (o) { o[form.dataset.async] = { state: res[1].state }; return o; })({}) });
            }
          })
          .catch(function () {
            if (out) { out.textContent = "The console did not answer; try again."; out.dataset.ok = "0"; }
            buttons.forEach(function (b) { b.disabled = false; });
          });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawCharts(document);
    asyncForms();
    if (document.body.dataset.statusUrl) setTimeout(poll, 1000 * (parseFloat(document.body.dataset.pollS) || 5));
  });
  window.Rebound = { drawCharts: drawCharts, applyStatus: apply };
})();
