// Search on a page opened from disk (site/index.html): a file:// page may not start a Web Worker, so the
// theme's search worker runs in a hidden iframe of the page's own origin instead (a classic <script> may be
// loaded from disk). Served over http(s), the browser's own Worker is used unchanged. The name holds
// "iframe-worker" so the theme's offline plugin adds no copy of its own from the network.
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  function FrameWorker(url) {
    var listeners = [], queue = [], loaded = false, self = this;
    var frame = document.createElement("iframe");
    frame.setAttribute("aria-hidden", "true");
    frame.style.display = "none";
    document.documentElement.appendChild(frame);
    var scope = frame.contentWindow;
    this.onmessage = null;
    scope.postMessage = function (data) {  // the worker's replies, delivered as a Worker delivers them
      setTimeout(function () {
        var event = { data: data, target: self };
        if (typeof self.onmessage === "function") self.onmessage(event);
        listeners.slice().forEach(function (fn) { fn.call(self, event); });
      }, 0);
    };
    scope.importScripts = function () {
      throw new Error("importScripts is not available to a search worker opened from disk");
    };
    function deliver(data) { scope.dispatchEvent(new scope.MessageEvent("message", { data: data })); }
    var script = scope.document.createElement("script");
    script.src = new URL(url, location.href).href;
    script.onload = function () { loaded = true; queue.splice(0).forEach(deliver); };
    scope.document.documentElement.appendChild(script);
    this.postMessage = function (data) { if (loaded) setTimeout(function () { deliver(data); }, 0); else queue.push(data); };
    this.addEventListener = function (type, fn) { if (type === "message") listeners.push(fn); };
    this.removeEventListener = function (type, fn) {
      var i = listeners.indexOf(fn);
      if (type === "message" && i >= 0) listeners.splice(i, 1);
    };
    this.terminate = function () { frame.remove(); listeners = []; };
  }

  window.Worker = FrameWorker;
})();
