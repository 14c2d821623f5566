// Trajectory page: j = next rollout, k = previous (through the run's filtered list).
// No build step; the links themselves carry the filter querystring.
(function () {
  "use strict";
  function typing(el) {
    if (!el) return false;
    var tag = el.tagName;
    return el.isContentEditable || tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
  }
  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
    if (typing(event.target)) return;
    var which = event.key === "j" ? "next" : event.key === "k" ? "prev" : null;
    if (!which) return;
    var link = document.querySelector('a[data-nav="' + which + '"]');
    if (link && link.href) {
      event.preventDefault();
      window.location.assign(link.href);
    }
  });
})();
